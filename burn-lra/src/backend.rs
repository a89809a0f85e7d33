//! Backends: which are compiled in, and the device each one runs on.

use anyhow::{Result, bail};
use burn::prelude::*;
use serde::{Deserialize, Serialize};

/// A Burn backend the harness can run on. Each is a cargo feature of this crate; `flex` is the
/// default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// Burn's pure-Rust CPU backend (feature `flex`, the default).
    Flex,
    /// ndarray CPU backend (feature `ndarray`).
    Ndarray,
    /// libtorch on the CPU (feature `tch`).
    Tch,
    /// libtorch on CUDA device 0 (feature `tch`).
    TchCuda,
    /// wgpu: Vulkan, Metal or WebGPU, whichever the machine has (feature `wgpu`).
    Wgpu,
    /// CUDA through CubeCL, device 0 (feature `cuda`).
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

    /// The cargo feature that compiles it in.
    pub fn feature(self) -> &'static str {
        match self {
            Self::TchCuda => "tch",
            other => other.name(),
        }
    }

    /// Whether this build has it.
    pub fn is_compiled(self) -> bool {
        match self {
            Self::Flex => cfg!(feature = "flex"),
            Self::Ndarray => cfg!(feature = "ndarray"),
            Self::Tch | Self::TchCuda => cfg!(feature = "tch"),
            Self::Wgpu => cfg!(feature = "wgpu"),
            Self::Cuda => cfg!(feature = "cuda"),
        }
    }

    /// The backends this build has.
    pub fn compiled() -> Vec<BackendKind> {
        Self::ALL.into_iter().filter(|b| b.is_compiled()).collect()
    }

    /// A device of the first compiled-in backend (flex in a default build): for building
    /// models whose parameters are only counted or loaded, not trained.
    pub fn any_device() -> Result<Device> {
        match Self::compiled().first() {
            Some(backend) => backend.device(),
            None => bail!("no backend is compiled in (enable one of the features)"),
        }
    }

    /// The device to run on (without autodiff), or an error naming the missing feature.
    #[allow(deprecated, unreachable_code)] // ndarray and tch constructors are deprecated in 0.22
    pub fn device(self) -> Result<Device> {
        if !self.is_compiled() {
            let have: Vec<&str> = Self::compiled().iter().map(|b| b.name()).collect();
            bail!(
                "backend `{}` is not compiled in: rebuild with `--features {}` \
                 (this build has: {})",
                self.name(),
                self.feature(),
                have.join(", ")
            );
        }
        Ok(match self {
            #[cfg(feature = "flex")]
            Self::Flex => Device::flex(),
            #[cfg(feature = "ndarray")]
            Self::Ndarray => Device::ndarray(),
            #[cfg(feature = "tch")]
            Self::Tch => Device::libtorch(),
            #[cfg(feature = "tch")]
            Self::TchCuda => Device::libtorch_cuda(0),
            #[cfg(feature = "wgpu")]
            Self::Wgpu => Device::wgpu(DeviceKind::DefaultDevice),
            #[cfg(feature = "cuda")]
            Self::Cuda => Device::cuda(0),
            #[allow(unreachable_patterns)]
            _ => unreachable!("checked by is_compiled"),
        })
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
