//! The tasks and the backends by name, as flags, files and run directories spell them.

use serde::{Deserialize, Serialize};

/// A task by name, as flags, files and run directories spell it (`listops`). Which tasks exist
/// is the harness's task registry's to say (`burn-lra tasks`); here a name is only checked to be
/// one: lowercase ASCII letters and digits, `-` between them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Task(String);

impl Task {
    /// The task called `name`; an error where `name` cannot be a task's name.
    pub fn new(name: &str) -> Result<Self, String> {
        let well_formed = !name.is_empty()
            && !name.starts_with('-')
            && !name.ends_with('-')
            && (name.bytes()).all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if well_formed {
            Ok(Self(name.to_string()))
        } else {
            Err(format!(
                "`{name}` is not a task name (lowercase letters and digits, `-` between them)"
            ))
        }
    }

    /// The task's name in flags, files and run directories.
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Task {
    type Error = String;

    fn try_from(name: String) -> Result<Self, String> {
        Self::new(&name)
    }
}

impl From<Task> for String {
    fn from(task: Task) -> String {
        task.0
    }
}

impl std::str::FromStr for Task {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        Self::new(name)
    }
}

impl PartialEq<str> for Task {
    fn eq(&self, name: &str) -> bool {
        self.0 == name
    }
}

impl PartialEq<&str> for Task {
    fn eq(&self, name: &&str) -> bool {
        self.0 == *name
    }
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A Burn backend the harness can run on. Each is a cargo feature of `burn-lra`; `flex` is the
/// default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// Burn's pure-Rust CPU backend (feature `flex`, the default).
    Flex,
    /// ndarray CPU backend (feature `ndarray`).
    Ndarray,
    /// libtorch on the CPU (feature `tch`).
    Tch,
    /// libtorch on a CUDA device (feature `tch`).
    TchCuda,
    /// wgpu: Vulkan, Metal or WebGPU, whichever the machine has (feature `wgpu`).
    Wgpu,
    /// CUDA through CubeCL (feature `cuda`).
    Cuda,
}

impl BackendKind {
    /// All backends, in the order listings show them.
    pub const ALL: [BackendKind; 6] = [
        Self::Flex,
        Self::Ndarray,
        Self::Tch,
        Self::TchCuda,
        Self::Wgpu,
        Self::Cuda,
    ];

    /// The flag spelling, e.g. `tch-cuda`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Flex => "flex",
            Self::Ndarray => "ndarray",
            Self::Tch => "tch",
            Self::TchCuda => "tch-cuda",
            Self::Wgpu => "wgpu",
            Self::Cuda => "cuda",
        }
    }

    /// The cargo feature of `burn-lra` that compiles it in.
    pub fn feature(self) -> &'static str {
        match self {
            Self::TchCuda => "tch",
            other => other.name(),
        }
    }

    /// Whether it runs on the host's CPU cores (its runs share them) rather than on a device of
    /// its own (`burn-lra train --device`).
    pub fn runs_on_cpu(self) -> bool {
        matches!(self, Self::Flex | Self::Ndarray | Self::Tch)
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
