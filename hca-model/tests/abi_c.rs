//! The C header and the Rust ABI agree: every constant, struct size, field offset and field
//! width in `abi::layout()` is computed by the C compiler from `guest-kmod/include/hca_abi.h`
//! and compared, and every `HCA_` constant the header defines is known to Rust. The same for
//! the user verbs ABI, `hca_uapi.h` against `uapi.rs`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use hca_model::abi::layout;

fn header() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../guest-kmod/include/hca_abi.h")
}

fn headers() -> [PathBuf; 2] {
    [header(), header().with_file_name("hca_uapi.h")]
}

/// A C program printing `name value` for each entry, generated from the Rust table so that it
/// fails to compile if the header lacks any name.
fn c_program() -> String {
    let mut c = String::from("#include <stdio.h>\n#include <stddef.h>\n#include \"hca_abi.h\"\n#include \"hca_uapi.h\"\n");
    c.push_str(
        "#define P(n, v) printf(\"%s %llu\\n\", n, (unsigned long long)(v))\nint main(void)\n{\n",
    );
    for (name, _) in layout() {
        let expr = match name.split('.').collect::<Vec<_>>()[..] {
            [k] => k.to_string(),
            [s, "size"] => format!("sizeof(struct {s})"),
            [s, f] => format!("offsetof(struct {s}, {f})"),
            [s, f, "width"] => format!("sizeof(((struct {s} *)0)->{f})"),
            _ => panic!("unexpected layout key {name}"),
        };
        c.push_str(&format!("\tP(\"{name}\", {expr});\n"));
    }
    c.push_str("\treturn 0;\n}\n");
    c
}

#[test]
fn test_c_header_matches_rust_abi() {
    let dir = std::env::temp_dir().join(format!("hca-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("abi_print.c");
    let exe = dir.join("abi_print");
    std::fs::write(&src, c_program()).unwrap();
    let inc = header().parent().unwrap().to_path_buf();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(&inc)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}` ({e}); install gcc"));
    assert!(
        out.status.success(),
        "hca_abi.h does not define what abi.rs has:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let printed = String::from_utf8(run.stdout).unwrap();
    let mut mismatches = Vec::new();
    for ((name, rust), line) in layout().iter().zip(printed.lines()) {
        let (cname, cval) = line.split_once(' ').unwrap();
        assert_eq!(cname, name);
        let cval: u64 = cval.parse().unwrap();
        if cval != *rust {
            mismatches.push(format!("{name}: C {cval:#x}, Rust {rust:#x}"));
        }
    }
    assert_eq!(printed.lines().count(), layout().len());
    assert!(
        mismatches.is_empty(),
        "ABI mismatch:\n{}",
        mismatches.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn test_every_c_constant_is_known_to_rust() {
    let text: String = headers()
        .iter()
        .map(|h| std::fs::read_to_string(h).unwrap())
        .collect();
    let rust: BTreeSet<String> = layout().into_iter().map(|(n, _)| n).collect();
    let c_only: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("#define "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with("HCA_") && !n.ends_with("_H") && !n.contains('('))
        .filter(|n| !rust.contains(*n))
        .map(String::from)
        .collect();
    assert!(c_only.is_empty(), "defined in C only: {c_only:?}");
}
