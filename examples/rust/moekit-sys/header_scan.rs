//! A scanner for moekit.h: its constants, typedef names, struct fields and function prototypes, read from the
//! header's text. It knows only the forms moekit.h uses (one header, written to a house style), and panics on
//! anything else so that a new form is noticed. Shared by the build script (which turns it into the C probe)
//! and the header_mirror test (which compares the prototypes with the extern block).
#![allow(dead_code)] // each of the two users needs part of it

pub struct Header {
    /// Every `#define MOEKIT_* <value>` and every enumerator, in header order.
    pub constants: Vec<String>,
    /// Every typedef name (enums, structs, handle pointers), in header order.
    pub types: Vec<String>,
    pub structs: Vec<Struct>,
    pub functions: Vec<Function>,
}

pub struct Struct {
    /// The typedef name, e.g. `moekit_tensor_t`.
    pub name: String,
    pub fields: Vec<Field>,
}

pub struct Field {
    pub name: String,
    /// Normalised C type: `int64_t[MOEKIT_MAX_RANK]`, `void*`, `const int64_t*`.
    pub c_type: String,
}

pub struct Function {
    pub name: String,
    pub ret: String,
    /// Normalised C types of the parameters, without their names; empty for `(void)`.
    pub params: Vec<String>,
}

pub fn scan(source: &str) -> Header {
    let (code, defines) = preprocess(&strip_comments(source));
    let mut header = Header { constants: defines, types: Vec::new(), structs: Vec::new(), functions: Vec::new() };
    for declaration in split_top_level(&code, ';') {
        let declaration = collapse_whitespace(&declaration);
        if declaration.is_empty() {
            continue;
        }
        if let Some(rest) = declaration.strip_prefix("MOEKIT_API ") {
            header.functions.push(parse_function(rest));
        } else if declaration.starts_with("typedef enum") || declaration.starts_with("enum {") {
            let (body, after) = braces(&declaration);
            for enumerator in body.split(',') {
                let name = enumerator.split('=').next().unwrap().trim();
                if !name.is_empty() {
                    header.constants.push(name.to_string());
                }
            }
            if declaration.starts_with("typedef") {
                header.types.push(after.trim().to_string());
            }
        } else if declaration.starts_with("typedef struct") && declaration.contains('{') {
            let (body, after) = braces(&declaration);
            let name = after.trim().to_string();
            header.types.push(name.clone());
            let fields = split_top_level(body, ';').iter().flat_map(|d| parse_fields(d.trim())).collect();
            header.structs.push(Struct { name, fields });
        } else if declaration.starts_with("typedef struct") {
            // typedef struct moekit_handle* moekit_handle_t
            header.types.push(last_identifier(&declaration).to_string());
        } else {
            panic!("moekit.h: a declaration of an unknown form: {declaration}");
        }
    }
    header
}

fn strip_comments(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("/*") {
            let end = after.find("*/").expect("moekit.h: an unterminated comment");
            out.push(' ');
            rest = &after[end + 2..];
        } else if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |end| &after[end..]);
        } else if rest.starts_with('"') {
            // `extern "C"`: copy string literals whole so no comment marker is seen inside one.
            let end = rest[1..].find('"').expect("moekit.h: an unterminated string") + 2;
            out.push_str(&rest[..end]);
            rest = &rest[end..];
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// Drops preprocessor lines and the C++-only `#ifdef __cplusplus` blocks; returns the code left and the names of
/// the value-carrying `#define MOEKIT_*` macros (not the export macro, not the include guard).
fn preprocess(source: &str) -> (String, Vec<String>) {
    let mut code = String::new();
    let mut defines = Vec::new();
    let mut skip_depth = 0;
    for line in source.lines() {
        let trimmed = line.trim();
        if let Some(directive) = trimmed.strip_prefix('#') {
            let words: Vec<&str> = directive.split_whitespace().collect();
            match words.first().copied() {
                Some("ifdef") if words.get(1) == Some(&"__cplusplus") || skip_depth > 0 => skip_depth += 1,
                Some("if") | Some("ifdef") | Some("ifndef") if skip_depth > 0 => skip_depth += 1,
                Some("endif") if skip_depth > 0 => skip_depth -= 1,
                Some("define") if skip_depth == 0 && words.len() >= 3 => {
                    let name = words[1];
                    if name.starts_with("MOEKIT_") && name != "MOEKIT_API" && !name.contains('(') {
                        defines.push(name.to_string());
                    }
                }
                _ => {}
            }
            continue;
        }
        if skip_depth == 0 {
            code.push_str(line);
            code.push('\n');
        }
    }
    (code, defines)
}

/// Splits at `separator` outside braces and parentheses.
fn split_top_level(text: &str, separator: char) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut current = String::new();
    for c in text.chars() {
        match c {
            '{' | '(' => depth += 1,
            '}' | ')' => depth -= 1,
            _ => {}
        }
        if c == separator && depth == 0 {
            parts.push(std::mem::take(&mut current));
        } else {
            current.push(c);
        }
    }
    if !current.trim().is_empty() {
        parts.push(current);
    }
    parts
}

fn collapse_whitespace(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The text between the first `{` and the last `}`, and what follows the `}`.
fn braces(declaration: &str) -> (&str, &str) {
    let open = declaration.find('{').unwrap();
    let close = declaration.rfind('}').unwrap();
    (&declaration[open + 1..close], &declaration[close + 1..])
}

fn last_identifier(text: &str) -> &str {
    let end = text.trim_end().len();
    let start = text[..end].rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
    &text[start..end]
}

/// `const moekit_x_t * name` -> ("const moekit_x_t*", "name"); `void` alone -> ("void", "").
fn split_declarator(declaration: &str) -> (String, String) {
    let declaration = declaration.trim();
    let name = last_identifier(declaration);
    let type_part = declaration[..declaration.len() - name.len()].trim();
    if type_part.is_empty() || type_part == "const" {
        return (normalise_type(declaration), String::new()); // no name: `void`, a bare type
    }
    (normalise_type(type_part), name.to_string())
}

fn normalise_type(c_type: &str) -> String {
    collapse_whitespace(&c_type.replace('*', " * ")).replace(" *", "*")
}

fn parse_fields(declaration: &str) -> Vec<Field> {
    if declaration.is_empty() {
        return Vec::new();
    }
    let declarators: Vec<&str> = declaration.split(',').collect();
    let (first_type, _) = split_declarator(strip_array(declarators[0]).0);
    // The base type of `T a, b` (pointer stars belong to each declarator, but moekit.h has none in such lists).
    declarators
        .iter()
        .enumerate()
        .map(|(i, declarator)| {
            let (without_array, array) = strip_array(declarator);
            let (c_type, name) = if i == 0 {
                split_declarator(without_array)
            } else {
                (first_type.clone(), without_array.trim().to_string())
            };
            let c_type = match array {
                Some(extent) => format!("{c_type}[{extent}]"),
                None => c_type,
            };
            Field { name, c_type }
        })
        .collect()
}

/// `shape[MOEKIT_MAX_RANK]` -> ("shape", Some("MOEKIT_MAX_RANK")).
fn strip_array(declarator: &str) -> (&str, Option<&str>) {
    match declarator.find('[') {
        Some(open) => {
            let close = declarator.rfind(']').expect("moekit.h: an unterminated array extent");
            (&declarator[..open], Some(declarator[open + 1..close].trim()))
        }
        None => (declarator, None),
    }
}

fn parse_function(prototype: &str) -> Function {
    let open = prototype.find('(').expect("moekit.h: a function without parameters");
    let close = prototype.rfind(')').unwrap();
    let (ret, name) = split_declarator(&prototype[..open]);
    let params: Vec<String> = prototype[open + 1..close]
        .split(',')
        .map(|param| split_declarator(param).0)
        .filter(|param| param != "void")
        .collect();
    Function { name, ret, params }
}
