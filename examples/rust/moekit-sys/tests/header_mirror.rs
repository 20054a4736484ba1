//! moekit-sys against the real moekit.h (the one the build script found):
//!  - every constant, every type's size and alignment and every struct field's offset, as rustc sees this crate's
//!    definitions, equals what a C program built from the header prints (the build script generates both sides from
//!    the header, so a constant, type or field the crate lacks fails to compile here);
//!  - every function prototype and struct field type of the header, spelled in Rust, is the one in src/lib.rs, and
//!    src/lib.rs declares nothing the header does not;
//!  - the library that got linked is the header's version.
#[path = "../header_scan.rs"]
mod header_scan;

use std::collections::BTreeMap;
use std::process::Command;

use moekit_sys::moekit_status_t;

/// A constant's value as the C probe prints it (`(long long)NAME`).
trait ProbeValue {
    fn probe_value(&self) -> i64;
}
impl ProbeValue for i32 {
    fn probe_value(&self) -> i64 {
        i64::from(*self)
    }
}
impl ProbeValue for u32 {
    fn probe_value(&self) -> i64 {
        i64::from(*self)
    }
}
impl ProbeValue for usize {
    fn probe_value(&self) -> i64 {
        *self as i64
    }
}
impl ProbeValue for moekit_status_t {
    fn probe_value(&self) -> i64 {
        i64::from(self.0)
    }
}

include!(concat!(env!("OUT_DIR"), "/rust_layout.rs"));

fn header() -> header_scan::Header {
    header_scan::scan(&std::fs::read_to_string(env!("MOEKIT_HEADER")).expect("read moekit.h"))
}

/// Differences between two maps, one line each; empty when they are equal.
fn differences<V: PartialEq + std::fmt::Debug>(c: &BTreeMap<String, V>, rust: &BTreeMap<String, V>) -> Vec<String> {
    let mut out = Vec::new();
    for (key, c_value) in c {
        match rust.get(key) {
            None => out.push(format!("{key}: in moekit.h ({c_value:?}), not in moekit-sys")),
            Some(rust_value) if rust_value != c_value => {
                out.push(format!("{key}: moekit.h {c_value:?}, moekit-sys {rust_value:?}"))
            }
            Some(_) => {}
        }
    }
    for (key, rust_value) in rust {
        if !c.contains_key(key) {
            out.push(format!("{key}: in moekit-sys ({rust_value:?}), not in moekit.h"));
        }
    }
    out
}

#[test]
fn constants_sizes_and_offsets_match_the_c_compiler() {
    let output = Command::new(env!("MOEKIT_ABI_PROBE")).output().expect("run the ABI probe");
    assert!(output.status.success(), "the ABI probe failed");
    let c: BTreeMap<String, i64> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let (key, value) = line.rsplit_once(' ').expect("probe line: <kind> <name> <value>");
            (key.to_string(), value.parse().expect("probe value"))
        })
        .collect();
    assert!(c.len() > 100, "the probe printed only {} items", c.len());
    let rust: BTreeMap<String, i64> = rust_layout().into_iter().collect();
    let diff = differences(&c, &rust);
    assert!(diff.is_empty(), "moekit-sys and moekit.h disagree:\n{}", diff.join("\n"));
}

/// A C type of moekit.h spelled as src/lib.rs spells it.
fn rust_type(c_type: &str) -> String {
    if let Some(array) = c_type.strip_suffix(']') {
        let (element, extent) = array.split_once('[').unwrap();
        return format!("[{}; {}]", rust_type(element), extent);
    }
    if let Some(pointee) = c_type.strip_suffix('*') {
        let pointee = pointee.trim();
        let (mutability, pointee) = match pointee.strip_prefix("const ") {
            Some(pointee) => ("const", pointee),
            None => ("mut", pointee),
        };
        let pointee = if pointee == "void" { "c_void".to_string() } else { rust_type(pointee) };
        return format!("*{mutability} {pointee}");
    }
    match c_type {
        "void" => "()".into(), // a return type; `void*` is c_void above
        "char" => "c_char".into(),
        "size_t" => "usize".into(),
        "int32_t" => "i32".into(),
        "uint32_t" => "u32".into(),
        "int64_t" => "i64".into(),
        "uint64_t" => "u64".into(),
        "double" => "f64".into(),
        name if name.starts_with("moekit_") => name.into(),
        other => panic!("moekit.h uses a C type this test cannot spell in Rust: {other}"),
    }
}

/// src/lib.rs without comments, whitespace collapsed.
fn rust_source() -> String {
    let source: String = include_str!("../src/lib.rs")
        .lines()
        .map(|line| line.split("//").next().unwrap())
        .collect::<Vec<_>>()
        .join(" ");
    source.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn split_items(list: &str) -> Vec<String> {
    list.split(',').map(|item| item.trim().to_string()).filter(|item| !item.is_empty()).collect()
}

#[test]
fn prototypes_match_the_header() {
    let c: BTreeMap<String, String> = header()
        .functions
        .iter()
        .map(|f| {
            let params: Vec<String> = f.params.iter().map(|p| rust_type(p)).collect();
            (f.name.clone(), format!("({}) -> {}", params.join(", "), rust_type(&f.ret)))
        })
        .collect();
    let source = rust_source();
    let mut rust = BTreeMap::new();
    for item in source.split("pub fn ").skip(1) {
        let open = item.find('(').unwrap();
        let close = item.find(')').unwrap();
        let name = item[..open].trim().to_string();
        // Parameter types only: `name: type`.
        let params: Vec<String> = split_items(&item[open + 1..close])
            .iter()
            .map(|param| param.split_once(':').expect("name: type").1.trim().to_string())
            .collect();
        let rest = &item[close + 1..item.find(';').unwrap()];
        let ret = rest.trim().strip_prefix("->").map_or("()", str::trim).to_string();
        rust.insert(name, format!("({}) -> {}", params.join(", "), ret));
    }
    assert_eq!(
        c.len(),
        65,
        "moekit.h declares {} functions; update this count with tests/abi/public_symbols.txt",
        c.len()
    );
    let diff = differences(&c, &rust);
    assert!(diff.is_empty(), "the extern block and moekit.h disagree:\n{}", diff.join("\n"));
}

#[test]
fn struct_fields_match_the_header() {
    let header = header();
    let source = rust_source();
    let mut c = BTreeMap::new();
    let mut rust = BTreeMap::new();
    for s in &header.structs {
        let fields: Vec<String> = s.fields.iter().map(|f| format!("{}: {}", f.name, rust_type(&f.c_type))).collect();
        c.insert(s.name.clone(), fields);
        let start = format!("pub struct {} {{", s.name);
        if let Some(at) = source.find(&start) {
            let body = &source[at + start.len()..];
            let body = &body[..body.find('}').unwrap()];
            let fields: Vec<String> = split_items(body)
                .iter()
                .map(|field| field.trim_start_matches("pub ").replace("r#", "").replace(" :", ":"))
                .collect();
            rust.insert(s.name.clone(), fields);
        }
    }
    let diff = differences(&c, &rust);
    assert!(diff.is_empty(), "struct fields of moekit-sys and moekit.h disagree:\n{}", diff.join("\n"));
}

#[test]
fn the_linked_library_is_the_headers_version() {
    // SAFETY: no arguments, no preconditions.
    let version = unsafe { moekit_sys::moekit_get_version() };
    assert_eq!(version, moekit_sys::MOEKIT_VERSION_NUMBER);
}
