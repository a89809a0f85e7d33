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
            Self::TchCuda => Device::libtorch_cuda(cuda_device(index.unwrap_or(0))?),
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

/// `index`, once libtorch is seen to have that CUDA device: without one (no GPU or driver, or a
/// libtorch built without CUDA) the error says so, instead of libtorch's panic at the first
/// tensor.
#[cfg(feature = "tch")]
fn cuda_device(index: usize) -> Result<usize> {
    let count = tch::Cuda::device_count();
    if usize::try_from(count).is_ok_and(|count| index < count) {
        return Ok(index);
    }
    bail!(
        "backend `tch-cuda`: libtorch sees {count} CUDA device(s), so no device {index} (a GPU, \
         its driver and a libtorch built with CUDA are needed: docs/backends.md)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tch-cuda` where libtorch sees no CUDA device (CI: no GPU, and a CPU-only libtorch) is
    /// an error naming the backend, not libtorch's panic at the first tensor; where it sees one,
    /// device 0 is made.
    #[cfg(feature = "tch")]
    #[test]
    fn tch_cuda_needs_a_device_libtorch_sees() {
        let devices = tch::Cuda::device_count();
        let made = BackendKind::TchCuda.device_at(Some(0));
        if devices == 0 {
            let err = made.unwrap_err().to_string();
            assert!(
                err.contains("`tch-cuda`") && err.contains("no device 0"),
                "{err}"
            );
        } else {
            made.unwrap();
        }
        let past = usize::try_from(devices).unwrap();
        let err = BackendKind::TchCuda.device_at(Some(past)).unwrap_err();
        assert!(
            err.to_string().contains(&format!("no device {past}")),
            "{err}"
        );
    }

    #[test]
    fn a_backend_not_compiled_in_names_its_feature() {
        let missing = BackendKind::ALL.into_iter().find(|b| !b.is_compiled());
        if let Some(backend) = missing {
            let err = backend.device().unwrap_err().to_string();
            assert!(
                err.contains(&format!("--features {}", backend.feature())),
                "{err}"
            );
        }
    }
}
