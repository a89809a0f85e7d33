//! The variant table of the library's README is generated from the registry, [`VARIANTS`], so it
//! lists every variant and says what each one's `VariantInfo` says. When a variant is added or
//! its facts change, this test fails and shows the table; `BLESS=1 cargo test -p
//! burn-attention-zoo --test docs_tables` writes it between the README's markers.

use burn_attention_zoo::VARIANTS;

const START: &str = "<!-- variants: generated from VARIANTS -->\n";
const END: &str = "<!-- end variants -->";

/// The table, one row per registry name.
fn table() -> String {
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    let mut md = String::from(
        "| name | paper | time | memory | padding mask | attention mask | causal | cross-attention | rotary | fixed max length | weights sum to one | returns weights |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for v in VARIANTS {
        let c = &v.capabilities;
        md.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            v.name,
            v.paper,
            v.time,
            v.memory,
            yes_no(c.padding_mask),
            yes_no(c.attention_mask),
            yes_no(c.causal),
            yes_no(c.cross_attention),
            yes_no(c.rotary),
            yes_no(c.fixed_max_len),
            yes_no(c.weights_sum_to_one),
            yes_no(c.returns_weights),
        ));
    }
    md
}

#[test]
fn the_readme_lists_every_variant_as_the_registry_does() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
    let readme = std::fs::read_to_string(path).unwrap();
    let start = readme.find(START).expect("the README's start marker") + START.len();
    let end = start + readme[start..].find(END).expect("the README's end marker");
    let expected = table();
    if std::env::var_os("BLESS").is_some() {
        let updated = format!("{}{expected}{}", &readme[..start], &readme[end..]);
        std::fs::write(path, updated).unwrap();
        return;
    }
    assert_eq!(
        readme[start..end],
        expected,
        "burn-attention/README.md's variant table differs from VARIANTS; \
         `BLESS=1 cargo test -p burn-attention-zoo --test docs_tables` rewrites it"
    );
}

/// The features table of the README names every feature of Cargo.toml's `[features]` (save
/// `default`), once, in the order the manifest lists them.
#[test]
fn the_readme_documents_every_feature() {
    let manifest = include_str!("../Cargo.toml");
    let section = manifest
        .split("\n[features]\n")
        .nth(1)
        .expect("Cargo.toml has a [features] table");
    let section = section.split("\n[").next().unwrap_or(section);
    let features: Vec<&str> = section
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains(" = ["))
        .filter_map(|l| l.split(" = ").next())
        .filter(|&name| name != "default")
        .collect();
    let readme = include_str!("../README.md");
    let start = readme
        .find("<!-- features:")
        .expect("the README's features marker");
    let end = start
        + readme[start..]
            .find("<!-- end features -->")
            .expect("the README's features end marker");
    let documented: Vec<&str> = readme[start..end]
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .collect();
    assert_eq!(
        documented, features,
        "burn-attention/README.md's features table against Cargo.toml's [features]"
    );
}
