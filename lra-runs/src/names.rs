//! The tasks and the backends by name, as flags, files and run directories spell them.

use serde::{Deserialize, Serialize};

/// A Long Range Arena task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Task {
    /// ListOps: evaluate a nested list expression (10 classes).
    Listops,
    /// Byte-level text classification (IMDB reviews, or any `label<TAB>text` corpus).
    Text,
    /// Byte-level document matching (AAN citation pairs): two documents, related or not.
    Matching,
    /// Image classification from a sequence of grey pixels (CIFAR-10; any IDX image set).
    Image,
    /// Pathfinder at 32 x 32 pixels: are the two dots joined by one dashed path?
    Pathfinder,
    /// Path-X: Pathfinder at 128 x 128 pixels (16,384 tokens).
    Pathx,
}

impl Task {
    /// Every task.
    pub const ALL: [Task; 6] = [
        Task::Listops,
        Task::Text,
        Task::Matching,
        Task::Image,
        Task::Pathfinder,
        Task::Pathx,
    ];

    /// The task's name in flags, files and run directories.
    pub fn name(self) -> &'static str {
        match self {
            Task::Listops => "listops",
            Task::Text => "text",
            Task::Matching => "matching",
            Task::Image => "image",
            Task::Pathfinder => "pathfinder",
            Task::Pathx => "pathx",
        }
    }
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
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
