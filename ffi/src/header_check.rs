//! The committed header cannot drift from this crate: its functions, its
//! result and reason values, and the layout of every struct are compared with
//! the Rust definitions (the layouts by compiling a C program against it).

use crate::session::livereg_connect_options;
use crate::types::*;
use std::collections::{BTreeMap, BTreeSet};
use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn header() -> String {
    std::fs::read_to_string(crate_dir().join("../include/livereg.h")).expect("include/livereg.h")
}

fn rust_sources() -> String {
    std::fs::read_dir(crate_dir().join("src"))
        .unwrap()
        .map(|entry| std::fs::read_to_string(entry.unwrap().path()).unwrap())
        .collect()
}

/// Identifiers `livereg_*` directly followed by `(`.
fn called_names(text: &str, prefix: &str) -> BTreeSet<String> {
    text.match_indices(prefix)
        .filter_map(|(at, _)| {
            let rest = &text[at..];
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
            (rest[end..].starts_with('(')
                && (at == 0
                    || !text[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')))
            .then(|| rest[..end].to_owned())
        })
        .collect()
}

/// `NAME = value` pairs for identifiers starting with `LIVEREG_`.
fn constants(text: &str) -> BTreeMap<String, i64> {
    text.lines()
        .filter_map(|line| {
            let (name, value) = line.trim().split_once(" = ")?;
            if !name.starts_with("LIVEREG_") {
                return None;
            }
            let digits: String = value.chars().take_while(char::is_ascii_digit).collect();
            Some((name.to_owned(), digits.parse().ok()?))
        })
        .collect()
}

/// How many items the sources export: each has its own `#[no_mangle]` line.
fn exported_count(sources: &str) -> usize {
    sources
        .lines()
        .filter(|line| line.trim() == "#[no_mangle]")
        .count()
}

#[test]
fn header_declares_exactly_the_exported_functions() {
    let declared = called_names(&header(), "livereg_");
    let sources = rust_sources();
    let exported: BTreeSet<String> = sources
        .match_indices("extern \"C\" fn livereg_")
        .map(|(at, m)| {
            let rest = &sources[at + m.len() - "livereg_".len()..];
            rest[..rest.find('(').unwrap()].to_owned()
        })
        .collect();
    assert_eq!(
        declared, exported,
        "include/livereg.h and ffi/src disagree on the functions"
    );
    // Every item the library exports is one of them (none missed by the
    // pattern above).
    assert_eq!(exported.len(), exported_count(&sources));
}

#[test]
fn header_constants_match_the_rust_enums() {
    let in_header = constants(&header());
    // The C ABI's enums, as the core crate's lists made them.
    let mut in_rust: BTreeMap<String, i64> = livereg_result::ALL
        .iter()
        .map(|result| (format!("{result:?}"), *result as i64))
        .collect();
    in_rust.extend(livereg::Reason::ALL.iter().map(|reason| {
        let c = livereg_reason::from(*reason);
        (format!("{c:?}"), c as i64)
    }));
    in_rust.extend(
        crate::reaper_life::livereg_reaper_life::ALL
            .iter()
            .map(|life| (format!("{life:?}"), *life as i64)),
    );
    assert_eq!(in_header, in_rust);
    assert_eq!(
        in_header["LIVEREG_PANIC"],
        livereg_result::LIVEREG_PANIC as i64
    );
    assert_eq!(
        in_header["LIVEREG_REASON_STALLED"],
        livereg_reason::LIVEREG_REASON_STALLED as i64
    );
    // Exactly the core crate's two lists: every result, every reason.
    let mut listed: BTreeMap<String, i64> = livereg::RESULT_CODES
        .iter()
        .map(|code| (format!("LIVEREG_{}", code.name), i64::from(code.value)))
        .collect();
    listed.extend(livereg::Reason::ALL.iter().map(|reason| {
        (
            format!("LIVEREG_REASON_{}", reason.as_str().to_uppercase()),
            *reason as i64,
        )
    }));
    // And the reaper's states, named as the core crate names them.
    listed.extend(
        crate::reaper_life::livereg_reaper_life::ALL
            .iter()
            .map(|life| {
                let name = crate::reaper_life::name(*life).to_uppercase();
                (format!("LIVEREG_REAPER_{name}"), *life as i64)
            }),
    );
    assert_eq!(in_header, listed);
    for (code, result) in livereg::RESULT_CODES.iter().zip(livereg_result::ALL) {
        assert_eq!(result as u32, code.value, "{code:?}");
    }
}

macro_rules! layout {
    ($($ty:ident { $($field:ident),* $(,)? })*) => {
        vec![$(
            (format!("sizeof {}", stringify!($ty)), size_of::<$ty>()),
            $((format!("{}.{}", stringify!($ty), stringify!($field)), offset_of!($ty, $field)),)*
        )*]
    };
}

#[test]
fn header_structs_have_the_rust_layout() {
    let rust: Vec<(String, usize)> = layout! {
        livereg_options { capacity, mode, reap_timeout_ms, registration_grace_ms, progress_timeout_ms }
        livereg_stats {
            capacity, tracked_instances, reaper_alive, reaper_pid, boot_token, reap_timeout_ms,
            registration_grace_ms, ended_total, ended_by_reason, handler_failures, scans,
        }
        livereg_drop_event {
            instance_id, slot, generation, reason, pid, registered_ns, last_heartbeat_ns, silent_ns, label,
            remote,
        }
        livereg_callbacks { userdata, on_drop, on_clear, on_dying }
        livereg_connect_options { token, connect_timeout_ms, tls_ca_file, tls_cert_file, tls_key_file }
    };
    let mut program = String::from(
        "#include <livereg.h>\n#include <stddef.h>\n#include <stdio.h>\nint main(void) {\n",
    );
    for (what, _) in &rust {
        let expression = match what.strip_prefix("sizeof ") {
            Some(ty) => format!("sizeof({ty})"),
            None => {
                let (ty, field) = what.split_once('.').unwrap();
                format!("offsetof({ty}, {field})")
            }
        };
        program += &format!("    printf(\"{what} %zu\\n\", {expression});\n");
    }
    program +=
        "    printf(\"sizeof livereg_result %zu\\n\", sizeof(livereg_result));\n    return 0;\n}\n";
    let dir = std::env::temp_dir().join(format!("livereg-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (source, binary) = (dir.join("layout.c"), dir.join("layout"));
    std::fs::write(&source, program).unwrap();
    let compiled = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Werror", "-I"])
        .arg(crate_dir().join("../include"))
        .arg(&source)
        .arg("-o")
        .arg(&binary)
        .output()
        .expect("a C compiler");
    assert!(
        compiled.status.success(),
        "{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let printed = String::from_utf8(Command::new(&binary).output().unwrap().stdout).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let mut expected: Vec<String> = rust.iter().map(|(what, n)| format!("{what} {n}")).collect();
    expected.push(format!(
        "sizeof livereg_result {}",
        size_of::<livereg_result>()
    ));
    assert_eq!(printed.lines().collect::<Vec<_>>(), expected);
}

/// The C type a Rust parameter or return type of the ABI is, as the header
/// must spell it (`*const c_char` → `const char *`).
fn c_type(rust: &str) -> String {
    let rust = rust.trim();
    if let Some(inner) = rust.strip_prefix("*const ") {
        return format!("const {} *", c_type(inner).trim_end());
    }
    if let Some(inner) = rust.strip_prefix("*mut ") {
        let inner = c_type(inner);
        return if inner.ends_with('*') {
            format!("{inner}*")
        } else {
            format!("{inner} *")
        };
    }
    match rust {
        "c_char" => "char",
        "c_void" => "void",
        "c_int" => "int",
        "usize" => "size_t",
        "u64" => "uint64_t",
        "u32" => "uint32_t",
        "" => "void",
        other => other,
    }
    .to_owned()
}

/// Every exported function as `(name, C return type, C parameter types)`,
/// read from the Rust sources.
fn rust_prototypes() -> Vec<(String, String, Vec<String>)> {
    let sources = rust_sources();
    let mut prototypes = Vec::new();
    for (at, m) in sources.match_indices("extern \"C\" fn livereg_") {
        let start = at + m.len() - "livereg_".len();
        let open = start + sources[start..].find('(').unwrap();
        let name = sources[start..open].to_owned();
        let mut depth = 1;
        let mut close = open + 1;
        for (i, c) in sources[open + 1..].char_indices() {
            depth += match c {
                '(' => 1,
                ')' => -1,
                _ => 0,
            };
            if depth == 0 {
                close = open + 1 + i;
                break;
            }
        }
        let parameters = sources[open + 1..close]
            .split(',')
            .filter_map(|p| p.split_once(':').map(|(_, ty)| c_type(ty)))
            .collect();
        let rest = &sources[close + 1..];
        let signature = &rest[..rest.find('{').unwrap()];
        let ret = signature
            .split_once("->")
            .map_or_else(|| "void".to_owned(), |(_, ty)| c_type(ty));
        prototypes.push((name, ret, parameters));
    }
    prototypes
}

/// Compiles `program` against the header with warnings as errors.
fn compiles(program: &str, tag: &str) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("livereg-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("check.c");
    std::fs::write(&source, program).unwrap();
    let compiled = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Werror", "-c", "-I"])
        .arg(crate_dir().join("../include"))
        .arg(&source)
        .arg("-o")
        .arg(dir.join("check.o"))
        .output()
        .expect("a C compiler");
    let _ = std::fs::remove_dir_all(&dir);
    if compiled.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&compiled.stderr).into_owned())
    }
}

/// Every prototype in the header is the Rust function's, `const` included:
/// a pointer to each function, typed from the Rust signature, must take
/// the header's declaration without a warning.
#[test]
fn header_prototypes_are_the_rust_signatures() {
    let prototypes = rust_prototypes();
    assert_eq!(
        prototypes.len(),
        exported_count(&rust_sources()),
        "a prototype for every exported function"
    );
    let mut program = String::from("#include <livereg.h>\n");
    for (name, ret, parameters) in &prototypes {
        let parameters = if parameters.is_empty() {
            "void".to_owned()
        } else {
            parameters.join(", ")
        };
        program += &format!("{ret} (*const check_{name})({parameters}) = {name};\n");
    }
    compiles(&program, "prototypes").unwrap_or_else(|e| panic!("{e}\n{program}"));
    // And the check can fail: one `const` dropped is caught.
    let (name, ret, parameters) = prototypes
        .iter()
        .find(|(name, ..)| name == "livereg_ping")
        .unwrap();
    let wrong = format!(
        "#include <livereg.h>\n{ret} (*const check)({}) = {name};\n",
        parameters[0].replace("const ", "")
    );
    assert!(compiles(&wrong, "prototypes-wrong").is_err());
}

/// Every field each header struct declares is in the layout check above
/// (names from the header, compared with the Rust structs' field lists).
#[test]
fn header_struct_fields_are_every_rust_field() {
    let header = header();
    let rust_fields: BTreeMap<&str, Vec<String>> = [
        ("livereg_options", field_names::<livereg_options>()),
        ("livereg_stats", field_names::<livereg_stats>()),
        ("livereg_drop_event", field_names::<livereg_drop_event>()),
        ("livereg_callbacks", field_names::<livereg_callbacks>()),
        (
            "livereg_connect_options",
            field_names::<livereg_connect_options>(),
        ),
    ]
    .into_iter()
    .collect();
    for (name, fields) in &rust_fields {
        let open = header
            .find(&format!("typedef struct {name} {{"))
            .unwrap_or_else(|| panic!("{name} is not defined in the header"));
        let body = &header[open..open + header[open..].find(&format!("}} {name};")).unwrap()];
        let declared: Vec<String> = body
            .lines()
            .skip(1)
            .map(|line| line.split("/*").next().unwrap_or_default().trim())
            .filter(|line| line.ends_with(';'))
            .map(|line| {
                let line = line.trim_end_matches(';');
                let name_end = line.find(')').map_or(line, |at| &line[..at]);
                let name = name_end.rsplit([' ', '*', '(']).next().unwrap();
                name.split('[').next().unwrap().to_owned()
            })
            .collect();
        assert_eq!(&declared, fields, "{name}: header fields vs Rust fields");
    }
}

/// The field names of a `#[repr(C)]` struct of this crate, in order, from
/// its source.
fn field_names<T>() -> Vec<String> {
    let full = std::any::type_name::<T>();
    let name = full.rsplit("::").next().unwrap();
    let sources = rust_sources();
    let open = sources
        .find(&format!("pub struct {name} {{"))
        .unwrap_or_else(|| panic!("struct {name} not found"));
    let body = &sources[open..open + sources[open..].find("\n}").unwrap()];
    body.lines()
        .skip(1)
        .map(str::trim)
        .filter_map(|line| line.strip_prefix("pub "))
        .filter_map(|line| {
            line.split_once(':')
                .map(|(field, _)| field.trim().to_owned())
        })
        .collect()
}

/// The value of `#define NAME value` in the header.
fn define(header: &str, name: &str) -> String {
    header
        .lines()
        .find_map(|line| line.strip_prefix(&format!("#define {name} ")))
        .unwrap_or_else(|| panic!("the header defines no {name}"))
        .trim()
        .to_owned()
}

#[test]
fn header_version_macros_are_the_workspace_version() {
    let header = header();
    assert_eq!(
        define(&header, "LIVEREG_VERSION_STRING"),
        format!("\"{}\"", env!("CARGO_PKG_VERSION"))
    );
    for (macro_name, part) in [
        ("LIVEREG_VERSION_MAJOR", env!("CARGO_PKG_VERSION_MAJOR")),
        ("LIVEREG_VERSION_MINOR", env!("CARGO_PKG_VERSION_MINOR")),
        ("LIVEREG_VERSION_PATCH", env!("CARGO_PKG_VERSION_PATCH")),
    ] {
        assert_eq!(define(&header, macro_name), part, "{macro_name}");
    }
    assert_eq!(
        define(&header, "LIVEREG_ABI_MAJOR"),
        env!("LIVEREG_ABI_MAJOR"),
        "the header's ABI major is the SONAME's (ffi/build.rs)"
    );
    // The Python package is built outside the workspace: its crate carries
    // a copy of the version, which must be this one.
    let python = std::fs::read_to_string(crate_dir().join("python/Cargo.toml")).unwrap();
    let python_version = python
        .lines()
        .find_map(|line| line.strip_prefix("version = "))
        .expect("ffi/python/Cargo.toml has a version");
    assert_eq!(
        python_version,
        format!("\"{}\"", env!("CARGO_PKG_VERSION")),
        "ffi/python/Cargo.toml's version, the wheel's, is the workspace's (the root Cargo.toml)"
    );
}

/// The structs a caller fills or lends (every struct of the header passed
/// to the library by pointer, but the event the library hands out).
const SIZED: [&str; 4] = [
    "livereg_options",
    "livereg_stats",
    "livereg_callbacks",
    "livereg_connect_options",
];

/// Every function that takes a struct by pointer takes its size beside it
/// (`*_sized`, the size right after the struct), or is the plain entry point
/// of earlier releases, with a `_sized` sibling the header's macro of the
/// same name calls with `sizeof`: the rule holds for every such struct,
/// those to come too.
#[test]
fn every_struct_passed_to_the_library_travels_with_its_size() {
    let header = header();
    let structs: BTreeSet<String> = header
        .match_indices("typedef struct livereg_")
        .filter_map(|(at, _)| {
            let rest = &header[at + "typedef struct ".len()..];
            let name = &rest[..rest.find(' ')?];
            rest[name.len()..]
                .trim_start()
                .starts_with('{')
                .then(|| name.to_owned())
        })
        .collect();
    let mut checked = 0;
    for (name, _, parameters) in rust_prototypes() {
        for (at, parameter) in parameters.iter().enumerate() {
            let ty = parameter.trim_end_matches('*').trim();
            let ty = ty.strip_prefix("const ").unwrap_or(ty);
            if !structs.contains(ty) || ty == "livereg_drop_event" {
                continue;
            }
            assert!(
                SIZED.contains(&ty),
                "{name} takes {ty}: list it in SIZED and give it a SizedStruct impl"
            );
            checked += 1;
            if let Some(plain) = name.strip_suffix("_sized") {
                assert_eq!(
                    parameters.get(at + 1).map(String::as_str),
                    Some("size_t"),
                    "{name}: the size right after the {ty}"
                );
                let macro_line = format!("#define {plain}(");
                let open = header
                    .find(&macro_line)
                    .unwrap_or_else(|| panic!("no macro {plain}(...) calling {name}"));
                let body = &header[open..open + header[open..].find(")\n").unwrap()];
                assert!(
                    body.contains(&format!("{name}(")) && body.contains(&format!("sizeof({ty})")),
                    "{plain}'s macro passes sizeof({ty}) to {name}:\n{body}"
                );
            } else {
                let sized = format!("{name}_sized");
                assert!(
                    rust_prototypes().iter().any(|(n, ..)| *n == sized),
                    "{name} takes {ty} without its size, and there is no {sized}"
                );
            }
        }
    }
    assert!(checked >= 14, "the check found the structs: {checked}");
}
