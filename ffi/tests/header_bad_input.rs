//! Every export's comment in `include/ferrotron.h` states its bad-input
//! behaviour: the comment block right above each `ftn_*` declaration has a
//! paragraph starting `Bad input` (what may be NULL, alignment, zero sizes,
//! which errors come at the call and which at synchronize). The header is
//! also ASCII-only. The header is generated from the doc comments in
//! `ffi/src` (`cargo run -p xtask -- cbindgen`), so a new export without
//! the paragraph fails here.

use std::path::Path;

fn header() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../include/ferrotron.h");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The name of the `ftn_*` function a top-level declaration line declares.
fn declared(line: &str) -> Option<&str> {
    if !line.starts_with(|c: char| c.is_ascii_alphabetic()) || line.starts_with("typedef") {
        return None;
    }
    let open = line.find('(')?;
    let start = line[..open].rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))? + 1;
    let name = &line[start..open];
    name.starts_with("ftn_").then_some(name)
}

/// `(function, its comment block)` for every `ftn_*` declaration; the
/// comment is the `/* .. */` block ending on the line above (empty if none).
fn declarations(h: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = h.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let Some(name) = declared(l) else { continue };
        let mut comment = Vec::new();
        if i > 0 && lines[i - 1].trim_end().ends_with("*/") {
            let mut j = i - 1;
            loop {
                comment.push(lines[j]);
                if lines[j].trim_start().starts_with("/*") || j == 0 {
                    break;
                }
                j -= 1;
            }
            comment.reverse();
        }
        out.push((name.to_string(), comment.join("\n")));
    }
    out
}

/// The names of the declarations whose comment has no `Bad input`
/// paragraph (a line of the comment starting with it, or a sentence of it).
fn missing(h: &str) -> Vec<String> {
    declarations(h)
        .into_iter()
        .filter(|(_, c)| !c.contains("Bad input"))
        .map(|(n, _)| n)
        .collect()
}

#[test]
fn every_export_states_its_bad_input() {
    let h = header();
    let decls = declarations(&h);
    assert!(
        decls.len() >= 127,
        "found only {} ftn_* declarations in the header",
        decls.len()
    );
    let missing = missing(&h);
    assert!(
        missing.is_empty(),
        "{} of {} exports have no `Bad input` paragraph in their comment in include/ferrotron.h \
         (add one to the doc comment in ffi/src and rerun `cargo run -p xtask -- cbindgen`): {}",
        missing.len(),
        decls.len(),
        missing.join(", ")
    );
}

#[test]
fn the_header_is_ascii() {
    let h = header();
    for (i, l) in h.lines().enumerate() {
        assert!(
            l.is_ascii(),
            "include/ferrotron.h:{}: non-ASCII: {l}",
            i + 1
        );
    }
}

/// The check itself: a declaration without the paragraph is reported, one
/// with it is not, and a comment of another function does not count.
#[test]
fn the_check_finds_a_missing_paragraph() {
    let h = "/*\n Does a.\n\n Bad input: NULL `x`: ftnInvalidArgument.\n */\n\
             ftnResult_t ftn_a(int *x);\n\n/*\n Does b.\n */\nftnResult_t ftn_b(int *x,\n    int y);\n\n\
             ftnResult_t ftn_c(void);\nconst char *ftn_d(int s);\n";
    let names: Vec<String> = declarations(h).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["ftn_a", "ftn_b", "ftn_c", "ftn_d"]);
    assert_eq!(missing(h), ["ftn_b", "ftn_c", "ftn_d"]);
}
