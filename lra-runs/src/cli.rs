//! The command line of `burn-lra` and `cargo xtask`: a usage mistake is one line, like every
//! other error of theirs.

/// Parses the process's arguments into `T`. `--help` and `--version` print as clap prints them;
/// a usage mistake (an unknown flag, a bad or missing value) prints one line, `error: ...`, the
/// possible values and the usage folded into it, and exits with status 2 as clap does.
pub fn parse_or_exit<T: clap::Parser>() -> T {
    match T::try_parse() {
        Ok(parsed) => parsed,
        Err(err) if !err.use_stderr() => err.exit(),
        Err(err) => {
            eprintln!("{}", one_line(&err.render().to_string()));
            std::process::exit(2)
        }
    }
}

/// Clap's rendering of an error folded into one line: its lines trimmed and joined, the blank
/// ones and the `--help` hint left out, the usage line in parentheses.
fn one_line(rendered: &str) -> String {
    let mut parts = Vec::new();
    for line in rendered.lines().map(str::trim) {
        if line.is_empty() || line.starts_with("For more information") {
            continue;
        }
        match line.strip_prefix("Usage: ") {
            Some(usage) => parts.push(format!("(usage: {usage})")),
            None => parts.push(line.to_string()),
        }
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser, Debug)]
    struct Args {
        /// A choice.
        #[arg(long, value_enum)]
        backend: crate::BackendKind,
        /// A number.
        #[arg(long)]
        steps: usize,
    }

    #[test]
    fn usage_mistakes_are_one_line() {
        use clap::Parser;
        for (argv, needle) in [
            (
                vec!["x", "--backend", "foo", "--steps", "1"],
                "error: invalid value 'foo' for '--backend <BACKEND>' [possible values: flex,",
            ),
            (
                vec!["x", "--backend", "flex"],
                "error: the following required arguments were not provided: --steps <STEPS> (usage: x --backend <BACKEND> --steps <STEPS>)",
            ),
            (
                vec!["x", "--backend", "flex", "--steps", "-1"],
                "error: unexpected argument '-1' found",
            ),
        ] {
            let err = Args::try_parse_from(argv).unwrap_err();
            let line = one_line(&err.render().to_string());
            assert!(!line.contains('\n'), "{line}");
            assert!(line.starts_with(needle), "{line}");
            assert!(!line.contains("For more information"), "{line}");
        }
    }
}
