//! The part of CEL that CRD validation rules (`x-kubernetes-validations`) use here: `self` and
//! `oldSelf`, field selection, `has()`, `size()`, string, integer, boolean, `null` and empty
//! list literals, `==`, `!=`, `!`, `&&`, `||`, `? :` and parentheses, evaluated over JSON values
//! as kube-apiserver evaluates them (a missing field is an error; `has()` tests presence;
//! `&&` and `||` absorb an error the other side decides).
//!
//! A CRD whose rule uses anything else is refused when it is created, so a rule is never
//! silently skipped: the embedded server either enforces a rule as a cluster would or says it
//! cannot.

use serde_json::Value;

/// A parsed rule.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// `self` or `oldSelf`.
    Var(Var),
    /// A literal.
    Lit(Value),
    /// `e.field`.
    Select(Box<Expr>, String),
    /// `has(e.field)`.
    Has(Box<Expr>, String),
    /// `size(e)`.
    Size(Box<Expr>),
    /// `!e`.
    Not(Box<Expr>),
    /// `a == b` (`true`) or `a != b` (`false`).
    Eq(Box<Expr>, Box<Expr>, bool),
    /// `a && b`.
    And(Box<Expr>, Box<Expr>),
    /// `a || b`.
    Or(Box<Expr>, Box<Expr>),
    /// `c ? a : b`.
    Cond(Box<Expr>, Box<Expr>, Box<Expr>),
}

/// The two variables a rule sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Var {
    /// The value the rule is on.
    This,
    /// Its value before the update (transition rules).
    Old,
}

impl Expr {
    /// Whether the rule reads `oldSelf` (a transition rule: evaluated on updates only, where the
    /// old object has a value at the rule's place).
    pub fn transition(&self) -> bool {
        match self {
            Expr::Var(v) => *v == Var::Old,
            Expr::Lit(_) => false,
            Expr::Select(e, _) | Expr::Has(e, _) | Expr::Size(e) | Expr::Not(e) => e.transition(),
            Expr::Eq(a, b, _) | Expr::And(a, b) | Expr::Or(a, b) => a.transition() || b.transition(),
            Expr::Cond(c, a, b) => c.transition() || a.transition() || b.transition(),
        }
    }

    /// Evaluate with `self` and `oldSelf` bound: the rule holds, fails, or cannot be evaluated
    /// (the error as kube-apiserver words it: `no such key: x`).
    pub fn holds(&self, this: &Value, old: Option<&Value>) -> Result<bool, String> {
        match self.eval(this, old)? {
            Value::Bool(b) => Ok(b),
            other => Err(format!("rule evaluated to {other}, not a boolean")),
        }
    }

    fn eval(&self, this: &Value, old: Option<&Value>) -> Result<Value, String> {
        let bool_of = |e: &Expr| match e.eval(this, old)? {
            Value::Bool(b) => Ok(b),
            other => Err(format!("no such overload: {other} is not a boolean")),
        };
        Ok(match self {
            Expr::Var(Var::This) => this.clone(),
            Expr::Var(Var::Old) => old.cloned().ok_or("oldSelf is not defined on create")?,
            Expr::Lit(v) => v.clone(),
            Expr::Select(e, field) => match e.eval(this, old)? {
                Value::Object(m) => m
                    .get(field)
                    .cloned()
                    .ok_or_else(|| format!("no such key: {field}"))?,
                other => return Err(format!("no such key: {field} (on {})", kind(&other))),
            },
            Expr::Has(e, field) => match e.eval(this, old)? {
                Value::Object(m) => Value::Bool(m.contains_key(field)),
                other => return Err(format!("no such overload: has() on {}", kind(&other))),
            },
            Expr::Size(e) => match e.eval(this, old)? {
                Value::String(s) => Value::from(s.chars().count()),
                Value::Array(a) => Value::from(a.len()),
                Value::Object(m) => Value::from(m.len()),
                other => return Err(format!("no such overload: size() of {}", kind(&other))),
            },
            Expr::Not(e) => Value::Bool(!bool_of(e)?),
            Expr::Eq(a, b, want) => Value::Bool(equal(&a.eval(this, old)?, &b.eval(this, old)?) == *want),
            // CEL's logical operators are commutative: an error on one side is absorbed when the
            // other side decides.
            Expr::And(a, b) => match (bool_of(a), bool_of(b)) {
                (Ok(false), _) | (_, Ok(false)) => Value::Bool(false),
                (Ok(true), Ok(true)) => Value::Bool(true),
                (Err(e), _) | (_, Err(e)) => return Err(e),
            },
            Expr::Or(a, b) => match (bool_of(a), bool_of(b)) {
                (Ok(true), _) | (_, Ok(true)) => Value::Bool(true),
                (Ok(false), Ok(false)) => Value::Bool(false),
                (Err(e), _) | (_, Err(e)) => return Err(e),
            },
            Expr::Cond(c, a, b) => {
                if bool_of(c)? {
                    a.eval(this, old)?
                } else {
                    b.eval(this, old)?
                }
            }
        })
    }
}

/// CEL equality over JSON: numbers by value, lists in order, maps by key, no coercion otherwise.
fn equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| equal(a, b)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| equal(v, w)))
        }
        _ => a == b,
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "map",
    }
}

/// Parse a rule.
///
/// # Errors
/// What in the rule is outside the part of CEL this server evaluates, and where.
pub fn parse(rule: &str) -> Result<Expr, String> {
    let tokens = lex(rule)?;
    let mut p = Parser { tokens, at: 0 };
    let e = p.cond()?;
    match p.tokens.get(p.at) {
        None => Ok(e),
        Some(t) => Err(format!("unexpected {t:?} at token {}", p.at + 1)),
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Int(i64),
    Sym(&'static str),
}

const SYMBOLS: [&str; 13] = [
    "==", "!=", "&&", "||", "!", "?", ":", ".", "(", ")", "[", "]", ",",
];

fn lex(src: &str) -> Result<Vec<Tok>, String> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(c) = rest.chars().next() {
        if c.is_whitespace() {
            rest = &rest[c.len_utf8()..];
        } else if let Some(sym) = SYMBOLS.iter().find(|s| rest.starts_with(**s)) {
            out.push(Tok::Sym(sym));
            rest = &rest[sym.len()..];
        } else if c == '\'' || c == '"' {
            let body = &rest[1..];
            let end = body
                .find(c)
                .ok_or_else(|| format!("unterminated string in {src:?}"))?;
            if body[..end].contains('\\') {
                return Err(format!("escapes in string literals are not supported: {src:?}"));
            }
            out.push(Tok::Str(body[..end].to_string()));
            rest = &body[end + 1..];
        } else if c.is_ascii_digit() {
            let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
            let n = rest[..end]
                .parse()
                .map_err(|e| format!("{e}: {}", &rest[..end]))?;
            out.push(Tok::Int(n));
            rest = &rest[end..];
        } else if c.is_ascii_alphabetic() || c == '_' {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            out.push(Tok::Ident(rest[..end].to_string()));
            rest = &rest[end..];
        } else {
            return Err(format!("unsupported character {c:?} in {src:?}"));
        }
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<Tok>,
    at: usize,
}

impl Parser {
    fn eat(&mut self, sym: &str) -> bool {
        let hit = matches!(self.tokens.get(self.at), Some(Tok::Sym(s)) if *s == sym);
        self.at += usize::from(hit);
        hit
    }

    fn expect(&mut self, sym: &str) -> Result<(), String> {
        if self.eat(sym) {
            Ok(())
        } else {
            Err(format!("expected {sym:?} at token {}", self.at + 1))
        }
    }

    fn cond(&mut self) -> Result<Expr, String> {
        let c = self.or()?;
        if !self.eat("?") {
            return Ok(c);
        }
        let a = self.cond()?;
        self.expect(":")?;
        let b = self.cond()?;
        Ok(Expr::Cond(Box::new(c), Box::new(a), Box::new(b)))
    }

    fn or(&mut self) -> Result<Expr, String> {
        let mut e = self.and()?;
        while self.eat("||") {
            e = Expr::Or(Box::new(e), Box::new(self.and()?));
        }
        Ok(e)
    }

    fn and(&mut self) -> Result<Expr, String> {
        let mut e = self.rel()?;
        while self.eat("&&") {
            e = Expr::And(Box::new(e), Box::new(self.rel()?));
        }
        Ok(e)
    }

    fn rel(&mut self) -> Result<Expr, String> {
        let a = self.unary()?;
        for (sym, want) in [("==", true), ("!=", false)] {
            if self.eat(sym) {
                return Ok(Expr::Eq(Box::new(a), Box::new(self.unary()?), want));
            }
        }
        Ok(a)
    }

    fn unary(&mut self) -> Result<Expr, String> {
        if self.eat("!") {
            return Ok(Expr::Not(Box::new(self.unary()?)));
        }
        let mut e = self.primary()?;
        while self.eat(".") {
            e = Expr::Select(Box::new(e), self.ident()?);
        }
        Ok(e)
    }

    fn ident(&mut self) -> Result<String, String> {
        match self.tokens.get(self.at).cloned() {
            Some(Tok::Ident(name)) => {
                self.at += 1;
                Ok(name)
            }
            other => Err(format!(
                "expected a field name at token {}, found {other:?}",
                self.at + 1
            )),
        }
    }

    fn primary(&mut self) -> Result<Expr, String> {
        let tok = self.tokens.get(self.at).cloned();
        self.at += 1;
        Ok(match tok {
            Some(Tok::Str(s)) => Expr::Lit(Value::String(s)),
            Some(Tok::Int(n)) => Expr::Lit(Value::from(n)),
            Some(Tok::Sym("(")) => {
                let e = self.cond()?;
                self.expect(")")?;
                e
            }
            Some(Tok::Sym("[")) => {
                self.expect("]")?;
                Expr::Lit(Value::Array(Vec::new()))
            }
            Some(Tok::Ident(name)) => match name.as_str() {
                "self" => Expr::Var(Var::This),
                "oldSelf" => Expr::Var(Var::Old),
                "true" => Expr::Lit(Value::Bool(true)),
                "false" => Expr::Lit(Value::Bool(false)),
                "null" => Expr::Lit(Value::Null),
                "has" => {
                    self.expect("(")?;
                    let e = match self.unary()? {
                        Expr::Select(e, field) => Expr::Has(e, field),
                        _ => return Err("has() takes a field selection (has(self.field))".into()),
                    };
                    self.expect(")")?;
                    e
                }
                "size" => {
                    self.expect("(")?;
                    let e = self.cond()?;
                    self.expect(")")?;
                    Expr::Size(Box::new(e))
                }
                other => return Err(format!("{other:?} is not supported here")),
            },
            other => return Err(format!("unexpected {other:?} at token {}", self.at)),
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn holds(rule: &str, this: Value, old: Option<Value>) -> Result<bool, String> {
        parse(rule)?.holds(&this, old.as_ref())
    }

    #[test]
    fn immutability_rules_hold_and_fail_as_on_a_cluster() {
        let rule = "(has(self.clusterName) ? self.clusterName : '') == (has(oldSelf.clusterName) ? oldSelf.clusterName : '')";
        let a = json!({"clusterName": "a"});
        assert_eq!(holds(rule, a.clone(), Some(a.clone())), Ok(true));
        assert_eq!(
            holds(rule, json!({"clusterName": "b"}), Some(a.clone())),
            Ok(false)
        );
        assert_eq!(
            holds(rule, json!({}), Some(a.clone())),
            Ok(false),
            "removing it changes it"
        );
        assert_eq!(holds(rule, json!({}), Some(json!({}))), Ok(true));
        assert!(parse(rule).is_ok_and(|e| e.transition()));
        let refs = "self.controllerRef == oldSelf.controllerRef";
        let r = json!({"controllerRef": {"name": "slurm", "namespace": "x"}});
        assert_eq!(holds(refs, r.clone(), Some(r.clone())), Ok(true));
        assert_eq!(
            holds(
                refs,
                json!({"controllerRef": {"name": "other", "namespace": "x"}}),
                Some(r)
            ),
            Ok(false)
        );
    }

    #[test]
    fn missing_fields_are_errors_that_logic_can_absorb() {
        assert_eq!(
            holds("self.a == 1", json!({}), None),
            Err("no such key: a".into())
        );
        assert_eq!(holds("!has(self.a) || self.a == 1", json!({}), None), Ok(true));
        assert_eq!(
            holds("self.a == 1 || true", json!({}), None),
            Ok(true),
            "commutative"
        );
        assert_eq!(holds("self.a == 1 && false", json!({}), None), Ok(false));
        assert_eq!(
            holds("size(self.l) == 0 && self.l == []", json!({"l": []}), None),
            Ok(true)
        );
        assert_eq!(
            holds("self.n != 2", json!({"n": 2.0}), None),
            Ok(false),
            "numbers by value"
        );
    }

    #[test]
    fn what_it_cannot_evaluate_is_refused_when_parsed() {
        for rule in [
            "self.x.startsWith('a')",
            "self.a > 1",
            "self.l.all(x, x == 1)",
            "'a\\'b' == self.s",
        ] {
            assert!(parse(rule).is_err(), "{rule} parsed");
        }
    }
}
