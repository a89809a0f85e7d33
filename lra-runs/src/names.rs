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

/// The separator of a hybrid stack's pattern: `gla+local` is a layer of `gla`, then one of
/// `local`, repeated.
pub const HYBRID_SEPARATOR: char = '+';

/// The longest attention name a run directory takes whole (bytes); a longer pattern is filed
/// under a shortened name with a hash of the whole ([`AttentionName::dir_name`]), since file
/// systems refuse names over 255 bytes.
pub const MAX_DIR_NAME: usize = 96;

/// An attention as flags, files and run directories name it: a registry name (`gla`), or a
/// hybrid stack's pattern of them joined by `+` (`gla+local`), parsed once here for the harness
/// and the sweep tool alike. Which names exist is the library's registry's to say; here every
/// part is only checked to be a name: lowercase ASCII letters and digits, `-` between them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AttentionName(String);

impl AttentionName {
    /// The attention called `name`; an error naming the pattern and the part where `name` is
    /// not one (an empty part, as in `gla++local` or `gla+`, or a part with other characters).
    pub fn new(name: &str) -> Result<Self, String> {
        if name.is_empty() {
            return Err("the attention's name is empty".to_string());
        }
        let parts: Vec<&str> = name.split(HYBRID_SEPARATOR).collect();
        for (i, part) in parts.iter().enumerate() {
            let which = if parts.len() == 1 {
                String::new()
            } else {
                format!(
                    " in the pattern `{name}`, layer {} of {},",
                    i + 1,
                    parts.len()
                )
            };
            if part.is_empty() {
                return Err(format!(
                    "the attention name{which} is empty (a pattern joins names with one `+`, \
                     e.g. `gla+local`)"
                ));
            }
            let well_formed = !part.starts_with('-')
                && !part.ends_with('-')
                && (part.bytes())
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !well_formed {
                return Err(format!(
                    "`{part}`{which} is not an attention name (lowercase letters and digits, `-` \
                     between them)"
                ));
            }
        }
        Ok(Self(name.to_string()))
    }

    /// The name as given (`gla+local`).
    pub fn name(&self) -> &str {
        &self.0
    }

    /// The registry names of its layers, in order: one for a plain attention.
    pub fn parts(&self) -> Vec<&str> {
        self.0.split(HYBRID_SEPARATOR).collect()
    }

    /// Whether it names a hybrid stack (more than one part).
    pub fn is_hybrid(&self) -> bool {
        self.0.contains(HYBRID_SEPARATOR)
    }

    /// The folder its runs are filed under: the name itself up to [`MAX_DIR_NAME`] bytes;
    /// a longer pattern's first parts (whole, up to 64 bytes) then `~` and 16 hex digits of a
    /// 64-bit FNV-1a hash of the whole name, so that long patterns stay within file-name limits
    /// and two of them do not share a folder (each run records its whole name, which summaries
    /// check against the folder).
    pub fn dir_name(&self) -> String {
        attention_dir_name(&self.0)
    }
}

/// The folder the runs of the attention called `name` are filed under (see
/// [`AttentionName::dir_name`]).
pub fn attention_dir_name(name: &str) -> String {
    shortened_dir_name(name, HYBRID_SEPARATOR)
}

/// `name` as a folder's name: itself up to [`MAX_DIR_NAME`] bytes; a longer one its whole parts
/// (split at `separator`) up to 64 bytes, then `~` and a hash of the whole.
pub(crate) fn shortened_dir_name(name: &str, separator: char) -> String {
    if name.len() <= MAX_DIR_NAME {
        return name.to_string();
    }
    let mut head = String::new();
    for part in name.split(separator) {
        let next = usize::from(!head.is_empty()) + part.len();
        if head.len() + next > 64 {
            break;
        }
        if !head.is_empty() {
            head.push(separator);
        }
        head.push_str(part);
    }
    format!("{head}~{:016x}", fnv1a(name.as_bytes()))
}

/// 64-bit FNV-1a of `bytes`: a stable hash (the same in every build and on every machine).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl TryFrom<String> for AttentionName {
    type Error = String;

    fn try_from(name: String) -> Result<Self, String> {
        Self::new(&name)
    }
}

impl From<AttentionName> for String {
    fn from(name: AttentionName) -> String {
        name.0
    }
}

impl std::str::FromStr for AttentionName {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        Self::new(name)
    }
}

impl PartialEq<str> for AttentionName {
    fn eq(&self, name: &str) -> bool {
        self.0 == name
    }
}

impl PartialEq<&str> for AttentionName {
    fn eq(&self, name: &&str) -> bool {
        self.0 == *name
    }
}

impl std::borrow::Borrow<str> for AttentionName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for AttentionName {
    type Target = str;

    /// The name as given, so that an `AttentionName` reads wherever a `&str` does.
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for AttentionName {
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
    /// wgpu with Burn's operation fusion and kernel autotuning (feature `wgpu-fused`). Fusion is
    /// a build-wide switch of Burn: a build with this feature runs every wgpu device fused, so it
    /// has this backend instead of `wgpu`.
    WgpuFused,
    /// CUDA through CubeCL (feature `cuda`).
    Cuda,
}

impl BackendKind {
    /// All backends, in the order listings show them.
    pub const ALL: [BackendKind; 7] = [
        Self::Flex,
        Self::Ndarray,
        Self::Tch,
        Self::TchCuda,
        Self::Wgpu,
        Self::WgpuFused,
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
            Self::WgpuFused => "wgpu-fused",
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Empty parts and odd characters are refused naming the pattern and the part; good names
    /// and patterns parse into their layers.
    #[test]
    fn attention_names_parse_once_with_errors_naming_the_part() {
        assert_eq!(
            AttentionName::new("gla+local").unwrap().parts(),
            ["gla", "local"]
        );
        assert!(!AttentionName::new("ff-linear").unwrap().is_hybrid());
        for (bad, says) in [
            ("", "the attention's name is empty"),
            ("+", "in the pattern `+`, layer 1 of 2, is empty"),
            (
                "gla++local",
                "in the pattern `gla++local`, layer 2 of 3, is empty",
            ),
            ("gla+", "in the pattern `gla+`, layer 2 of 2, is empty"),
            (
                "gla+Local",
                "`Local` in the pattern `gla+Local`, layer 2 of 2, is not",
            ),
            ("../x", "`../x` is not an attention name"),
        ] {
            let err = AttentionName::new(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{err}");
        }
    }

    /// A long pattern's folder stays within file-name limits, keeps its first layers readable
    /// and differs from another long pattern's that shares them.
    #[test]
    fn long_patterns_get_short_distinct_folders() {
        let long = vec!["gated-deltanet"; 40].join("+");
        let other = format!("{}+gla", vec!["gated-deltanet"; 39].join("+"));
        let (a, b) = (
            AttentionName::new(&long).unwrap().dir_name(),
            AttentionName::new(&other).unwrap().dir_name(),
        );
        assert!(
            a.len() <= MAX_DIR_NAME && b.len() <= MAX_DIR_NAME,
            "{a} {b}"
        );
        assert!(a.starts_with("gated-deltanet+gated-deltanet+"), "{a}");
        assert_ne!(a, b);
        assert_eq!(
            AttentionName::new("gla+local").unwrap().dir_name(),
            "gla+local"
        );
    }
}
