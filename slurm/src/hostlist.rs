//! Slurm host lists (`slinky-[0-2,5]`, `gpu[01-04]`, `a,b`): expanded to names to compare what
//! Slurm reports with what the host wants, and compressed to send a list Slurm (and an admin
//! reading `scontrol show reservation`) reads easily.

use std::collections::BTreeMap;

/// The most names one host list may expand to (a typo like `n[0-99999999]` is refused, not
/// expanded).
pub const MAX_NAMES: usize = 65_536;

/// Why a host list cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot read the host list {list:?}: {why}")]
pub struct HostlistError {
    /// The list.
    pub list: String,
    /// What is wrong.
    pub why: String,
}

/// The names of a host list, in its order (duplicates kept).
///
/// # Errors
/// Unbalanced brackets, a range that is not `lo-hi` of numbers with `lo <= hi`, or more than
/// [`MAX_NAMES`] names.
pub fn expand(list: &str) -> Result<Vec<String>, HostlistError> {
    let err = |why: String| HostlistError {
        list: list.to_string(),
        why,
    };
    let mut out = Vec::new();
    for item in split_top(list).map_err(err)? {
        let mut names = vec![String::new()];
        let mut rest = item.as_str();
        while !rest.is_empty() {
            match rest.find('[') {
                None => {
                    names.iter_mut().for_each(|n| n.push_str(rest));
                    rest = "";
                }
                Some(open) => {
                    let literal = &rest[..open];
                    let close = rest[open..]
                        .find(']')
                        .map(|c| c + open)
                        .ok_or_else(|| err(format!("no ']' after {:?}", &rest[open..])))?;
                    let numbers = ranges(&rest[open + 1..close]).map_err(err)?;
                    if names.len().saturating_mul(numbers.len()) > MAX_NAMES {
                        return Err(err(format!("more than {MAX_NAMES} names")));
                    }
                    names = names
                        .iter()
                        .flat_map(|n| numbers.iter().map(move |num| format!("{n}{literal}{num}")))
                        .collect();
                    rest = &rest[close + 1..];
                }
            }
        }
        out.extend(names);
        if out.len() > MAX_NAMES {
            return Err(err(format!("more than {MAX_NAMES} names")));
        }
    }
    Ok(out)
}

/// The items of a list: split at commas and white space outside brackets.
fn split_top(list: &str) -> Result<Vec<String>, String> {
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut current = String::new();
    for c in list.chars() {
        match c {
            '[' => {
                if depth > 0 {
                    return Err("nested '['".into());
                }
                depth += 1;
                current.push(c);
            }
            ']' => {
                if depth == 0 {
                    return Err("']' without '['".into());
                }
                depth -= 1;
                current.push(c);
            }
            ',' | ' ' | '\t' | '\n' if depth == 0 => {
                if !current.is_empty() {
                    items.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if depth > 0 {
        return Err("'[' without ']'".into());
    }
    if !current.is_empty() {
        items.push(current);
    }
    Ok(items)
}

/// The numbers of a bracket's ranges (`0-2,5` → `0 1 2 5`), zero-padded as written (`01-03`).
fn ranges(inside: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for part in inside.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(lo) || !digits(hi) {
            return Err(format!("{part:?} is not a number or a range of numbers"));
        }
        let width = if lo.len() > 1 && lo.starts_with('0') {
            lo.len()
        } else {
            0
        };
        let (a, b): (u64, u64) = match (lo.parse(), hi.parse()) {
            (Ok(a), Ok(b)) => (a, b),
            _ => return Err(format!("{part:?} is out of range")),
        };
        if a > b {
            return Err(format!("{part:?} runs backwards"));
        }
        if (b - a) as usize >= MAX_NAMES {
            return Err(format!("{part:?} has more than {MAX_NAMES} names"));
        }
        out.extend((a..=b).map(|n| format!("{n:0width$}")));
    }
    if out.is_empty() {
        return Err("empty brackets".into());
    }
    Ok(out)
}

/// One host list of `names` (sorted, without duplicates): names that differ only in a trailing
/// number share brackets (`slinky-[0-2,5]`); zero-padded numbers (`gpu01`) are grouped with
/// those of the same width only, so the list expands to exactly `names`.
pub fn compress<S: AsRef<str>>(names: &[S]) -> String {
    // (prefix, width) → numbers; names without a trailing number as they are.
    let mut groups: BTreeMap<(String, usize), Vec<u64>> = BTreeMap::new();
    let mut plain: Vec<String> = Vec::new();
    for name in names.iter().map(AsRef::as_ref) {
        let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (prefix, number) = name.split_at(name.len() - digits);
        match number.parse::<u64>() {
            // A number that does not print back as written (too long) stays a plain name.
            Ok(n) if !prefix.contains(['[', ']', ',']) => {
                let width = if number.len() > 1 && number.starts_with('0') {
                    number.len()
                } else {
                    0
                };
                if format!("{n:0width$}") == number {
                    groups.entry((prefix.to_string(), width)).or_default().push(n);
                } else {
                    plain.push(name.to_string());
                }
            }
            _ => plain.push(name.to_string()),
        }
    }
    let mut items: Vec<String> = Vec::new();
    for ((prefix, width), mut numbers) in groups {
        numbers.sort_unstable();
        numbers.dedup();
        if let [n] = numbers.as_slice() {
            items.push(format!("{prefix}{n:0width$}"));
            continue;
        }
        let mut spans: Vec<String> = Vec::new();
        let mut i = 0;
        while i < numbers.len() {
            let start = numbers[i];
            let mut end = start;
            while i + 1 < numbers.len() && numbers[i + 1] == end + 1 {
                i += 1;
                end = numbers[i];
            }
            spans.push(if start == end {
                format!("{start:0width$}")
            } else {
                format!("{start:0width$}-{end:0width$}")
            });
            i += 1;
        }
        items.push(format!("{prefix}[{}]", spans.join(",")));
    }
    plain.sort();
    plain.dedup();
    items.extend(plain);
    items.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &str) -> Vec<String> {
        expand(list).unwrap_or_else(|e| vec![e.to_string()])
    }

    #[test]
    fn slurm_lists_expand() {
        assert_eq!(
            names("slinky-[0-2,5]"),
            ["slinky-0", "slinky-1", "slinky-2", "slinky-5"]
        );
        assert_eq!(names("gpu[08-10]"), ["gpu08", "gpu09", "gpu10"]);
        assert_eq!(names("a,b c"), ["a", "b", "c"]);
        assert_eq!(names("r[1-2]n[1-2]"), ["r1n1", "r1n2", "r2n1", "r2n2"]);
        assert_eq!(names("n[1-2]-x,m"), ["n1-x", "n2-x", "m"]);
        assert!(names("").is_empty());
        for bad in [
            "n[1-",
            "n]1",
            "n[a-b]",
            "n[3-1]",
            "n[]",
            "n[0-99999999]",
            "n[[1]]",
        ] {
            assert!(expand(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn compressed_lists_expand_to_the_same_names() {
        let cases: [&[&str]; 5] = [
            &["slinky-0", "slinky-1", "slinky-2", "slinky-5"],
            &["gpu09", "gpu10", "gpu08"],
            &["n1", "n01", "n2", "login"],
            &["a"],
            &["x-7", "x-7", "x-8"],
        ];
        for names in cases {
            let list = compress(names);
            let mut want: Vec<String> = names.iter().map(|s| s.to_string()).collect();
            want.sort();
            want.dedup();
            let mut got = expand(&list).unwrap_or_default();
            got.sort();
            assert_eq!(got, want, "{list}");
        }
        assert_eq!(
            compress(&["slinky-0", "slinky-1", "slinky-2", "slinky-5"]),
            "slinky-[0-2,5]"
        );
        assert_eq!(compress(&["gpu08", "gpu09"]), "gpu[08-09]");
        assert_eq!(compress(&["a"]), "a");
    }
}
