//! Errors raised by attention configurations and inputs.

use std::fmt;

/// A configuration or input that an attention variant cannot accept.
///
/// Every variant names the offending field so that a bad configuration fails with a message a
/// user can act on, before any tensor work starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttentionError {
    /// A configuration field holds a value the variant cannot use.
    InvalidField {
        /// The attention variant (its registry name).
        variant: &'static str,
        /// The configuration field, e.g. `n_heads`.
        field: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// The variant does not support what the input asks for (causal masking, a length).
    Unsupported {
        /// The attention variant (its registry name).
        variant: &'static str,
        /// What was asked for.
        message: String,
    },
    /// The name is not in the registry.
    UnknownVariant {
        /// The name that was asked for.
        name: String,
        /// The registered names.
        known: Vec<&'static str>,
    },
    /// A hybrid stack's pattern (`gla+local`) with a part that names no attention.
    InvalidPattern {
        /// The pattern as given.
        pattern: String,
        /// What is wrong, naming the part.
        message: String,
    },
    /// Variant parameters given as key/value pairs (a config file) could not be applied.
    InvalidParams {
        /// The attention variant (its registry name).
        variant: &'static str,
        /// What is wrong with them.
        message: String,
    },
}

impl AttentionError {
    /// A bad configuration field.
    pub fn field(variant: &'static str, field: &'static str, message: impl Into<String>) -> Self {
        Self::InvalidField {
            variant,
            field,
            message: message.into(),
        }
    }

    /// The variant cannot do what was asked.
    pub fn unsupported(variant: &'static str, message: impl Into<String>) -> Self {
        Self::Unsupported {
            variant,
            message: message.into(),
        }
    }
}

impl fmt::Display for AttentionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidField {
                variant,
                field,
                message,
            } => write!(f, "{variant} attention: `{field}` {message}"),
            Self::Unsupported { variant, message } => {
                write!(f, "{variant} attention does not support {message}")
            }
            Self::UnknownVariant { name, known } if name.is_empty() => {
                write!(
                    f,
                    "the attention's name is empty (known: {})",
                    known.join(", ")
                )
            }
            Self::UnknownVariant { name, known } => {
                write!(
                    f,
                    "unknown attention `{name}` (known: {})",
                    known.join(", ")
                )
            }
            Self::InvalidPattern { pattern, message } => {
                write!(f, "attention pattern `{pattern}`: {message}")
            }
            Self::InvalidParams { variant, message } => {
                write!(f, "{variant} attention parameters: {message}")
            }
        }
    }
}

impl std::error::Error for AttentionError {}

/// Checks shared by every multi-head variant: `d_model` and `n_heads` positive and divisible,
/// `dropout` a probability.
pub fn check_heads(
    variant: &'static str,
    d_model: usize,
    n_heads: usize,
    dropout: f64,
) -> Result<(), AttentionError> {
    if n_heads == 0 {
        return Err(AttentionError::field(
            variant,
            "n_heads",
            "must be at least 1",
        ));
    }
    if d_model == 0 || !d_model.is_multiple_of(n_heads) {
        return Err(AttentionError::field(
            variant,
            "d_model",
            format!("must be a positive multiple of n_heads ({n_heads}), got {d_model}"),
        ));
    }
    if !(0.0..1.0).contains(&dropout) {
        return Err(AttentionError::field(
            variant,
            "dropout",
            format!("must be in [0, 1), got {dropout}"),
        ));
    }
    Ok(())
}

/// Refuses a count of 0 for `variant`'s `field` (a block size, a window, a number of features):
/// "must be at least 1".
pub fn check_at_least_one(
    variant: &'static str,
    field: &'static str,
    value: usize,
) -> Result<(), AttentionError> {
    if value == 0 {
        return Err(AttentionError::field(variant, field, "must be at least 1"));
    }
    Ok(())
}
