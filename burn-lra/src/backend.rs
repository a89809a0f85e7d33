//! Backends: which are compiled in, and the device each one runs on.

use anyhow::{Result, bail};
use burn::prelude::*;

pub use lra_runs::BackendKind;

/// The backends this build has.
pub fn compiled() -> Vec<BackendKind> {
    BackendKind::ALL
        .into_iter()
        .filter(|b| b.is_compiled())
        .collect()
}

/// A device of the first compiled-in backend (flex in a default build): for building models
/// whose parameters are only counted or loaded, not trained.
pub fn any_device() -> Result<Device> {
    match compiled().first() {
        Some(backend) => backend.device(),
        None => bail!("no backend is compiled in (enable one of the features)"),
    }
}

/// What this build can do with a backend: whether it is compiled in, and its devices.
pub trait BackendDevice {
    /// Whether this build has it.
    fn is_compiled(&self) -> bool;

    /// Its default device (without autodiff), or an error naming the missing feature.
    fn device(&self) -> Result<Device>;

    /// Its device number `index` (`burn-lra train --device`): the CUDA device for `cuda` and
    /// `tch-cuda`, the discrete GPU for `wgpu` and `wgpu-fused`; `None` is the default device. CPU backends have
    /// no numbered devices.
    fn device_at(&self, index: Option<usize>) -> Result<Device>;
}

impl BackendDevice for BackendKind {
    fn is_compiled(&self) -> bool {
        match *self {
            Self::Flex => cfg!(feature = "flex"),
            Self::Ndarray => cfg!(feature = "ndarray"),
            Self::Tch | Self::TchCuda => cfg!(feature = "tch"),
            Self::Wgpu => cfg!(all(feature = "wgpu", not(feature = "wgpu-fused"))),
            Self::WgpuFused => cfg!(feature = "wgpu-fused"),
            Self::Cuda => cfg!(feature = "cuda"),
        }
    }

    fn device(&self) -> Result<Device> {
        self.device_at(None)
    }

    #[allow(deprecated, unreachable_code, unused_variables)] // ndarray and tch constructors are deprecated in 0.22
    fn device_at(&self, index: Option<usize>) -> Result<Device> {
        if !self.is_compiled() {
            let have: Vec<&str> = compiled().iter().map(|b| b.name()).collect();
            bail!(
                "backend `{}` is not compiled in: rebuild with `--features {}` \
                 (this build has: {})",
                self.name(),
                self.feature(),
                have.join(", ")
            );
        }
        if index.is_some() && self.runs_on_cpu() {
            bail!(
                "--device: backend `{}` runs on the CPU and has no numbered devices",
                self.name()
            );
        }
        Ok(match *self {
            #[cfg(feature = "flex")]
            Self::Flex => Device::flex(),
            #[cfg(feature = "ndarray")]
            Self::Ndarray => Device::ndarray(),
            #[cfg(feature = "tch")]
            Self::Tch => Device::libtorch(),
            #[cfg(feature = "tch")]
            Self::TchCuda => Device::libtorch_cuda(index.unwrap_or(0)),
            #[cfg(feature = "wgpu")]
            Self::Wgpu | Self::WgpuFused => Device::wgpu(match index {
                Some(i) => DeviceKind::DiscreteGpu(i),
                None => DeviceKind::DefaultDevice,
            }),
            #[cfg(feature = "cuda")]
            Self::Cuda => Device::cuda(index.unwrap_or(0)),
            #[allow(unreachable_patterns)]
            _ => unreachable!("checked by is_compiled"),
        })
    }
}
