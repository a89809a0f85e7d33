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
        "| name | paper | time | memory | padding mask | causal | cross-attention | fixed max length | weights sum to one |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for v in VARIANTS {
        let c = &v.capabilities;
        md.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            v.name,
            v.paper,
            v.time,
            v.memory,
            yes_no(c.padding_mask),
            yes_no(c.causal),
            yes_no(c.cross_attention),
            yes_no(c.fixed_max_len),
            yes_no(c.weights_sum_to_one),
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
