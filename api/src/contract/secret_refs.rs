//! Secret values a builder places without seeing them: a builder that returns a Secret (an
//! Accounting's `slurmdbd.conf`, which holds the database password) writes
//! `${secretKeyRef:<name>/<key>}` where the value goes, in the Secret's `stringData`; the host
//! replaces it with the value of key `<key>` of the Secret `<name>` (in the parent's namespace,
//! and only a Secret the parent's spec references) after the output policy, so the value never
//! enters a guest.
//!
//! `${secretKeyRef:<name>/<key>|slurm}` places the value as one value of a Slurm configuration
//! file (`slurm.conf`, `slurmdbd.conf`): `\` and `#` escaped (Slurm reads an unescaped `#` as a
//! comment), in double quotes when it holds a space. Slinky writes the password as it is, so a
//! `#` in it silently cuts it short.

/// What opens a placeholder.
const OPEN: &str = "${secretKeyRef:";
/// The suffix of the Slurm-configuration encoding.
const SLURM: &str = "|slurm";

/// The placeholder of key `key` of the Secret `name`, placed as it is.
pub fn placeholder(name: &str, key: &str) -> String {
    format!("{OPEN}{name}/{key}}}")
}

/// The placeholder of key `key` of the Secret `name`, placed as one value of a Slurm
/// configuration file.
pub fn slurm_placeholder(name: &str, key: &str) -> String {
    format!("{OPEN}{name}/{key}{SLURM}}}")
}

/// `value` as one value of a Slurm configuration line (Slurm's `parse_config.c`: an unescaped
/// `#` starts a comment, `\` escapes, a value with spaces is double-quoted).
///
/// # Errors
/// A value Slurm cannot read back as one value: a double quote together with a space, or a
/// leading double quote.
pub fn slurm_value(value: &str) -> Result<String, String> {
    let escaped = value.replace('\\', "\\\\").replace('#', "\\#");
    let spaced = value.chars().any(char::is_whitespace);
    if value.starts_with('"') || (spaced && value.contains('"')) {
        return Err(
            "it starts with a double quote, or holds one and a space: Slurm cannot read it back \
             as one value of its configuration; choose another"
                .into(),
        );
    }
    Ok(if spaced { format!("\"{escaped}\"") } else { escaped })
}

/// A placeholder found in a text: the Secret and the key it names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SecretRef {
    /// The Secret's name.
    pub name: String,
    /// The key.
    pub key: String,
}

/// How a placeholder's value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    /// As it is.
    Raw,
    /// As one value of a Slurm configuration file ([`slurm_value`]).
    Slurm,
}

/// Each placeholder of `text`, in order, with its byte range.
///
/// # Errors
/// A placeholder that is not closed, or names no Secret or key.
fn placeholders(text: &str) -> Result<Vec<(std::ops::Range<usize>, SecretRef, Encoding)>, String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find(OPEN).map(|i| i + from) {
        let body_start = at + OPEN.len();
        let Some(len) = text[body_start..].find('}') else {
            return Err(format!(
                "a secret placeholder at byte {at} is not closed: write {}",
                placeholder("<secret>", "<key>")
            ));
        };
        let whole = &text[body_start..body_start + len];
        let (body, encoding) = match whole.strip_suffix(SLURM) {
            Some(b) => (b, Encoding::Slurm),
            None => (whole, Encoding::Raw),
        };
        let Some((name, key)) = body
            .split_once('/')
            .filter(|(n, k)| !n.is_empty() && !k.is_empty())
        else {
            return Err(format!(
                "the secret placeholder {OPEN}{whole}}} names no Secret and key: write {}",
                placeholder("<secret>", "<key>")
            ));
        };
        out.push((
            at..body_start + len + 1,
            SecretRef {
                name: name.to_string(),
                key: key.to_string(),
            },
            encoding,
        ));
        from = body_start + len + 1;
    }
    Ok(out)
}

/// The Secrets and keys `text` places, in order.
///
/// # Errors
/// As [`resolve`].
pub fn references(text: &str) -> Result<Vec<SecretRef>, String> {
    Ok(placeholders(text)?.into_iter().map(|(_, r, _)| r).collect())
}

/// `text` with each placeholder replaced by `value(reference)` (encoded as the placeholder says).
/// A value must be one line of text (no line break, no NUL): it lands in a configuration file,
/// where a line break would add lines the builder never wrote.
///
/// # Errors
/// A malformed placeholder, what `value` refuses, a value that is not one line, or one its
/// encoding cannot write.
pub fn resolve(text: &str, value: impl Fn(&SecretRef) -> Result<String, String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (range, r, encoding) in placeholders(text)? {
        let mut v = value(&r)?;
        if v.contains(['\n', '\r', '\0']) {
            return Err(format!(
                "the value of key {:?} of Secret {} holds a line break or NUL: it cannot be written \
                 into a configuration line; store it without one",
                r.key, r.name
            ));
        }
        if encoding == Encoding::Slurm {
            v = slurm_value(&v)
                .map_err(|e| format!("the value of key {:?} of Secret {}: {e}", r.key, r.name))?;
        }
        out.push_str(&text[last..range.start]);
        out.push_str(&v);
        last = range.end;
    }
    out.push_str(&text[last..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_found_and_replaced() -> Result<(), String> {
        let text = format!(
            "A=1\nStoragePass={}\nB={}x",
            placeholder("db", "password"),
            placeholder("o", "k")
        );
        assert_eq!(
            references(&text)?,
            [
                SecretRef {
                    name: "db".into(),
                    key: "password".into()
                },
                SecretRef {
                    name: "o".into(),
                    key: "k".into()
                }
            ]
        );
        let out = resolve(&text, |r| Ok(format!("<{}:{}>", r.name, r.key)))?;
        assert_eq!(out, "A=1\nStoragePass=<db:password>\nB=<o:k>x");
        assert_eq!(resolve("plain", |_| Err("unused".into()))?, "plain");
        Ok(())
    }

    #[test]
    fn slurm_values_are_escaped_and_quoted() -> Result<(), String> {
        assert_eq!(slurm_value("plain")?, "plain");
        assert_eq!(slurm_value("a#b\\c")?, "a\\#b\\\\c");
        assert_eq!(slurm_value("with space")?, "\"with space\"");
        assert!(slurm_value("\"quoted").is_err());
        assert!(slurm_value("a \"b").is_err());
        let text = format!("StoragePass={}", slurm_placeholder("db", "p"));
        assert_eq!(references(&text)?[0].key, "p");
        assert_eq!(resolve(&text, |_| Ok("x#y".into()))?, "StoragePass=x\\#y");
        Ok(())
    }

    #[test]
    fn bad_placeholders_and_values_are_refused() {
        assert!(references("${secretKeyRef:db").is_err_and(|e| e.contains("not closed")));
        assert!(references("${secretKeyRef:db}").is_err_and(|e| e.contains("names no Secret")));
        let text = placeholder("db", "p");
        assert!(resolve(&text, |_| Ok("a\nInjected=1".into())).is_err_and(|e| e.contains("line break")));
        assert!(resolve(&text, |_| Err("not referenced".into())).is_err_and(|e| e == "not referenced"));
    }
}
