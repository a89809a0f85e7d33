//! Counting the parameters a module trains.

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;

/// Number of trainable scalars in `module`: every float parameter except the frozen ones
/// (`Param::set_require_grad(false)`, e.g. Performer's random features), which Burn's
/// `Module::num_params` includes. Works on any device: the count is taken on the module's
/// training view ([`Module::train`]), where the configured gradient settings apply.
pub fn num_trainable_params<M: Module>(module: &M) -> usize {
    struct Count(usize);
    impl ModuleVisitor for Count {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if param.is_require_grad() {
                self.0 += param.shape().num_elements();
            }
        }
    }
    let mut count = Count(0);
    module.clone().train().visit(&mut count);
    count.0
}

/// Number of scalars in `module`'s float parameters, frozen ones included, counted from their
/// shapes without initialising any (Burn's initialisers and this crate's variants build parameters
/// lazily, so nothing is allocated), with checked arithmetic: `None` when the count does not
/// fit in a `usize`. Burn's `Module::num_params` sums unchecked and overflows on absurd sizes;
/// this is the count to check a configuration's size with before anything is built for real.
pub fn num_params_checked<M: Module>(module: &M) -> Option<usize> {
    struct Count(Option<usize>);
    impl ModuleVisitor for Count {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let elements = param
                .lazy_shape()
                .iter()
                .try_fold(1usize, |n, &d| n.checked_mul(d));
            self.0 = self.0.zip(elements).and_then(|(a, b)| a.checked_add(b));
        }
    }
    let mut count = Count(Some(0));
    module.visit(&mut count);
    count.0
}

/// A parameter of `shape` whose value `init` draws on first use, as Burn's own initialisers do:
/// building a module allocates none of it, so a configuration's size can be counted
/// ([`Module::num_params`]) before any memory is committed to it.
pub(crate) fn lazy_param<const D: usize, F>(
    shape: [usize; D],
    device: &Device,
    require_grad: bool,
    init: F,
) -> Param<Tensor<D>>
where
    F: Fn(&Device) -> Tensor<D> + Send + Sync + 'static,
{
    Param::uninitialized(
        burn::module::ParamId::new(),
        move |device, require_grad| {
            // As Burn's initialisers: parameters live for the module's life, outside the
            // backends' pools of short-lived buffers.
            device.memory_persistent_allocations((), |_| {
                let tensor = init(device);
                if require_grad {
                    tensor.require_grad()
                } else {
                    tensor
                }
            })
        },
        device.clone(),
        require_grad,
        shape.into(),
    )
}
