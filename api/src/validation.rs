//! Kubernetes' name and value rules (`k8s.io/apimachinery/pkg/util/validation`), written once for
//! the host (which must never build an object the API server refuses), its output policy and the
//! embedded API server (which must refuse what kube-apiserver refuses, with the same messages).
//!
//! Each check returns the list of what is wrong, in kube-apiserver's words; an empty list means
//! valid. [`first_error`] turns a list into a `Result` for callers that want one message.

/// The longest DNS-1123 label (and label value, qualified-name part, DNS-1035 label).
pub const DNS1123_LABEL_MAX_LENGTH: usize = 63;
/// The longest DNS-1123 subdomain (object names of most kinds).
pub const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;
/// The longest label value.
pub const LABEL_VALUE_MAX_LENGTH: usize = 63;
/// The longest name part of a qualified name (label and annotation keys).
pub const QUALIFIED_NAME_MAX_LENGTH: usize = 63;
/// The most bytes all annotations of one object may hold together (keys and values).
pub const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_ERR: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_ERR: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const DNS1035_LABEL_ERR: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_ERR: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_ERR: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const C_IDENTIFIER_FMT: &str = "[A-Za-z_][A-Za-z0-9_]*";
const C_IDENTIFIER_ERR: &str = "a valid C identifier must start with alphabetic character or '_', followed by a string of alphanumeric characters or '_'";
const ENV_VAR_NAME_FMT: &str = "[-._a-zA-Z][-._a-zA-Z0-9]*";
const ENV_VAR_NAME_ERR: &str = "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit";
const CONFIG_MAP_KEY_FMT: &str = "[-._a-zA-Z0-9]+";
const CONFIG_MAP_KEY_ERR: &str =
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'";

/// "must be no more than N characters".
pub fn max_len_error(length: usize) -> String {
    format!("must be no more than {length} characters")
}

/// kube-apiserver's explanation of a pattern mismatch, with examples.
pub fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{msg} (regex used for validation is '{fmt}')");
    }
    let examples: Vec<String> = examples.iter().map(|e| format!("'{e}', ")).collect();
    // Like kube-apiserver's: "(e.g. 'a',  or 'b', regex …)", two spaces before "or" included.
    format!(
        "{msg} (e.g. {}regex used for validation is '{fmt}')",
        examples.join(" or ")
    )
}

/// "must be between LO and HI, inclusive".
pub fn inclusive_range_error(lo: i64, hi: i64) -> String {
    format!("must be between {lo} and {hi}, inclusive")
}

/// The first message of a list, as an error.
///
/// # Errors
/// The list's messages joined, when it is not empty.
pub fn first_error(errors: Vec<String>) -> Result<(), String> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn matches_dns1123_label(v: &str) -> bool {
    let b = v.as_bytes();
    !b.is_empty()
        && is_lower_alnum(b[0])
        && is_lower_alnum(b[b.len() - 1])
        && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
}

fn matches_dns1123_subdomain(v: &str) -> bool {
    v.split('.').all(matches_dns1123_label)
}

fn matches_qualified_name_part(v: &str) -> bool {
    let b = v.as_bytes();
    let ext = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.');
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|&c| ext(c))
}

/// `IsDNS1123Label`: pod hostnames and subdomains, namespace names, container and port names'
/// DNS form, Service names of most uses.
pub fn dns1123_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_LABEL_MAX_LENGTH));
    }
    if !matches_dns1123_label(value) {
        if matches_dns1123_subdomain(value) {
            errs.push("must not contain dots".into());
        } else {
            errs.push(regex_error(
                DNS1123_LABEL_ERR,
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errs
}

/// `IsDNS1123Subdomain`: object names of most kinds (pods, ConfigMaps, Secrets, …).
pub fn dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !matches_dns1123_subdomain(value) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_ERR,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

/// `IsDNS1035Label`: Service names.
pub fn dns1035_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_LABEL_MAX_LENGTH));
    }
    let b = value.as_bytes();
    let ok = !b.is_empty()
        && b[0].is_ascii_lowercase()
        && is_lower_alnum(b[b.len() - 1])
        && b.iter().all(|&c| is_lower_alnum(c) || c == b'-');
    if !ok {
        errs.push(regex_error(
            DNS1035_LABEL_ERR,
            DNS1035_LABEL_FMT,
            &["my-name", "abc-123"],
        ));
    }
    errs
}

/// `IsQualifiedName`: label and annotation keys (`[prefix/]name`, the prefix a DNS-1123
/// subdomain, the name at most 63 characters).
pub fn qualified_name(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".into());
            } else {
                errs.extend(
                    dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|e| format!("prefix part {e}")),
                );
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(
                    QUALIFIED_NAME_ERR,
                    QUALIFIED_NAME_FMT,
                    &["MyName", "my.name", "123-abc"]
                )
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".into());
    } else if name.len() > QUALIFIED_NAME_MAX_LENGTH {
        errs.push(format!("name part {}", max_len_error(QUALIFIED_NAME_MAX_LENGTH)));
    }
    if !matches_qualified_name_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_ERR,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

/// `IsValidLabelValue`: empty, or at most 63 characters of `[A-Za-z0-9-_.]` starting and
/// ending alphanumeric.
pub fn label_value(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > LABEL_VALUE_MAX_LENGTH {
        errs.push(max_len_error(LABEL_VALUE_MAX_LENGTH));
    }
    if !value.is_empty() && !matches_qualified_name_part(value) {
        errs.push(regex_error(
            LABEL_VALUE_ERR,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// `IsCIdentifier`.
pub fn c_identifier(value: &str) -> Vec<String> {
    let b = value.as_bytes();
    let ok = !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_');
    if ok {
        Vec::new()
    } else {
        vec![regex_error(
            C_IDENTIFIER_ERR,
            C_IDENTIFIER_FMT,
            &["my_name", "MY_NAME", "MyName"],
        )]
    }
}

fn ch_dir_prefix(value: &str) -> Vec<String> {
    match value {
        "." => vec!["must not be '.'".into()],
        ".." => vec!["must not be '..'".into()],
        v if v.starts_with("..") => vec!["must not start with '..'".into()],
        _ => Vec::new(),
    }
}

/// `IsEnvVarName`: container environment variable names.
pub fn env_var_name(value: &str) -> Vec<String> {
    let b = value.as_bytes();
    let first = |c: u8| c.is_ascii_alphabetic() || matches!(c, b'-' | b'.' | b'_');
    let ok = !b.is_empty() && first(b[0]) && b.iter().all(|&c| first(c) || c.is_ascii_digit());
    let mut errs = Vec::new();
    if !ok {
        errs.push(regex_error(
            ENV_VAR_NAME_ERR,
            ENV_VAR_NAME_FMT,
            &["my.env-name", "MY_ENV.NAME", "MyEnvName1"],
        ));
    }
    errs.extend(ch_dir_prefix(value));
    errs
}

/// `IsConfigMapKey`: keys of ConfigMap and Secret data.
pub fn config_map_key(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    let ok = !value.is_empty()
        && value
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_'));
    if !ok {
        errs.push(regex_error(
            CONFIG_MAP_KEY_ERR,
            CONFIG_MAP_KEY_FMT,
            &["key.name", "KEY_NAME", "key-name"],
        ));
    }
    errs.extend(ch_dir_prefix(value));
    errs
}

/// `IsValidPortNum`: 1 to 65535.
pub fn port_number(port: i64) -> Vec<String> {
    if (1..=65535).contains(&port) {
        Vec::new()
    } else {
        vec![inclusive_range_error(1, 65535)]
    }
}

/// `IsValidPortName` (IANA_SVC_NAME): at most 15 characters of `[-a-z0-9]`, at least one letter,
/// no `--`, no hyphen at either end.
pub fn port_name(port: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if port.len() > 15 {
        errs.push(max_len_error(15));
    }
    if port.is_empty() || !port.bytes().all(|c| is_lower_alnum(c) || c == b'-') {
        errs.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".into());
    }
    if !port.bytes().any(|c| c.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".into());
    }
    if port.contains("--") {
        errs.push("must not contain consecutive hyphens".into());
    }
    if port.starts_with('-') || port.ends_with('-') {
        errs.push("must not begin or end with a hyphen".into());
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names() {
        assert!(dns1123_label("slurm-worker-0").is_empty());
        assert_eq!(dns1123_label("a.b"), vec!["must not contain dots".to_string()]);
        assert!(dns1123_label("Bad")[0].starts_with("a lowercase RFC 1123 label"));
        assert_eq!(
            dns1123_label(&"a".repeat(64)),
            vec!["must be no more than 63 characters".to_string()]
        );
        assert!(dns1123_subdomain("a.b").is_empty());
        assert!(!dns1123_subdomain("-x").is_empty());
        assert!(!dns1123_subdomain("").is_empty());
        assert!(!dns1123_subdomain("a..b").is_empty());
        assert!(dns1035_label("slurm-controller").is_empty());
        assert!(!dns1035_label("0slurm").is_empty());
        assert!(!dns1035_label(&"a".repeat(64)).is_empty());
    }

    #[test]
    fn labels_keys_and_values() {
        assert!(label_value("").is_empty());
        assert!(label_value("My_value.1").is_empty());
        assert_eq!(label_value(&"a".repeat(64)), vec![max_len_error(63)]);
        assert!(!label_value("-a").is_empty());
        assert!(!label_value("a b").is_empty());
        assert!(qualified_name("app.kubernetes.io/name").is_empty());
        assert!(qualified_name("Simple").is_empty());
        assert_eq!(
            qualified_name("/x"),
            vec!["prefix part must be non-empty".to_string()]
        );
        assert!(!qualified_name("a/b/c").is_empty());
        assert!(qualified_name(&format!("x/{}", "a".repeat(64)))[0].starts_with("name part must be no more"));
        assert!(!qualified_name("Bad_Prefix/x").is_empty());
    }

    #[test]
    fn other_rules() {
        assert!(port_name("slurmd").is_empty());
        assert!(!port_name("http-metrics-too-long").is_empty());
        assert!(!port_name("123").is_empty());
        assert!(!port_name("a--b").is_empty());
        assert!(port_number(6817).is_empty());
        assert_eq!(port_number(70000), vec![inclusive_range_error(1, 65535)]);
        assert!(env_var_name("POD_CPUS").is_empty());
        assert!(!env_var_name("1X").is_empty());
        assert!(config_map_key("slurm.conf").is_empty());
        assert!(!config_map_key("bad key!").is_empty());
        assert!(!config_map_key("..x").is_empty());
        assert!(c_identifier("_ok1").is_empty());
        assert_eq!(
            regex_error("m", "f", &["a", "b"]),
            "m (e.g. 'a',  or 'b', regex used for validation is 'f')"
        );
    }
}
