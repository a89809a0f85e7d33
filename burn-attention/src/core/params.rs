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
