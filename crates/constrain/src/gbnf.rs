//! GBNF, llama.cpp's grammar format, translated to llguidance's Lark dialect.
//!
//! The reader follows llama.cpp's `grammar-parser` (rules `name ::= alternatives`, one per line
//! unless inside parentheses; literals, character classes, `.`, groups, `* + ?` and `{m,n}`;
//! `#` comments; the start rule is `root`; a rule defined twice keeps its last definition) and
//! reports errors with line and column. Token references (`<[id]>`, `<name>`) are refused by name.
//!
//! GBNF matches characters, with no lexer. Lark in llguidance lexes greedily, so a multi-character
//! literal next to another that extends it could hide strings GBNF accepts (`("a" | "ab") "bc"`).
//! Every literal is therefore emitted one character per lexeme, and every class and `.` matches
//! exactly one character: lexemes of fixed length one can never be confused, so the Lark grammar
//! accepts exactly the strings the GBNF does.

use std::collections::HashMap;
use std::fmt::Write;

use crate::ConstrainError;

/// Most nested parentheses.
const MAX_NESTING: usize = 64;
/// Largest bound of a `{m,n}` repetition (larger ones would blow up the compiled grammar).
const MAX_REPEAT: u32 = 1000;

#[derive(Debug, Clone)]
enum Expr {
    /// A literal string (possibly empty).
    Lit(String),
    /// One character in (or, negated, outside) the inclusive ranges.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    /// Any one character.
    Any,
    /// Another rule, by index.
    Ref(usize),
    /// Alternatives of sequences.
    Group(Vec<Vec<Expr>>),
    /// `min` to `max` (unbounded: `None`) repetitions.
    Repeat(Box<Expr>, u32, Option<u32>),
}

struct Parser {
    chars: Vec<char>,
    pos: usize,
    names: Vec<String>,
    index: HashMap<String, usize>,
    /// Body of each rule once defined; the char position of its first use, for errors.
    bodies: Vec<Option<Vec<Vec<Expr>>>>,
    first_use: Vec<usize>,
}

type Res<T> = Result<T, ConstrainError>;

/// Translates GBNF text into an equivalent Lark grammar for llguidance.
pub fn to_lark(src: &str) -> Result<String, ConstrainError> {
    let mut p = Parser {
        chars: src.chars().collect(),
        pos: 0,
        names: Vec::new(),
        index: HashMap::new(),
        bodies: Vec::new(),
        first_use: Vec::new(),
    };
    p.grammar()?;
    let Some(&root) = p.index.get("root") else {
        return Err(p.error_at(p.chars.len(), "the grammar has no `root` rule"));
    };
    for (i, body) in p.bodies.iter().enumerate() {
        if body.is_none() {
            return Err(p.error_at(p.first_use[i], &format!("undefined rule `{}`", p.names[i])));
        }
    }
    let mut out = String::new();
    let _ = writeln!(out, "start: {}", lark_name(&p.names[root], root));
    for (i, body) in p.bodies.iter().enumerate() {
        let Some(alts) = body else { continue };
        let _ = write!(out, "{}: ", lark_name(&p.names[i], i));
        emit_alts(&mut out, alts, &p.names);
        out.push('\n');
    }
    Ok(out)
}

/// A Lark rule name: lowercase (so Lark takes it as a rule, not a terminal), unique by index.
fn lark_name(name: &str, i: usize) -> String {
    format!("r{i}_{}", name.to_ascii_lowercase())
}

impl Parser {
    fn error_at(&self, pos: usize, msg: &str) -> ConstrainError {
        let before: String = self.chars[..pos.min(self.chars.len())].iter().collect();
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        ConstrainError::Gbnf {
            line,
            column,
            message: msg.to_string(),
        }
    }

    fn err<T>(&self, msg: &str) -> Res<T> {
        Err(self.error_at(self.pos, msg))
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, k: usize) -> Option<char> {
        self.chars.get(self.pos + k).copied()
    }

    /// Blanks and `#` comments; newlines only when `newline_ok`.
    fn space(&mut self, newline_ok: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.pos += 1,
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n' && c != '\r') {
                        self.pos += 1;
                    }
                }
                '\r' | '\n' if newline_ok => self.pos += 1,
                _ => break,
            }
        }
    }

    fn is_word(c: char) -> bool {
        c.is_ascii_alphanumeric() || c == '-'
    }

    fn name(&mut self) -> Res<String> {
        let start = self.pos;
        while self.peek().is_some_and(Self::is_word) {
            self.pos += 1;
        }
        if start == self.pos {
            return self.err("expected a rule name");
        }
        Ok(self.chars[start..self.pos].iter().collect())
    }

    fn rule_id(&mut self, name: &str, at: usize) -> usize {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        let i = self.names.len();
        self.names.push(name.to_string());
        self.index.insert(name.to_string(), i);
        self.bodies.push(None);
        self.first_use.push(at);
        i
    }

    fn grammar(&mut self) -> Res<()> {
        self.space(true);
        if self.peek().is_none() {
            return self.err("the grammar is empty");
        }
        while self.peek().is_some() {
            let at = self.pos;
            let name = self.name()?;
            self.space(false);
            if !(self.peek() == Some(':')
                && self.peek_at(1) == Some(':')
                && self.peek_at(2) == Some('='))
            {
                return self.err("expected `::=`");
            }
            self.pos += 3;
            self.space(true);
            let id = self.rule_id(&name, at);
            let alts = self.alternates(0)?;
            self.bodies[id] = Some(alts);
            match self.peek() {
                None | Some('\n') | Some('\r') => {}
                Some(c) => {
                    return self.err(&format!("unexpected `{c}`: expected a newline or the end"))
                }
            }
            self.space(true);
        }
        Ok(())
    }

    fn alternates(&mut self, depth: usize) -> Res<Vec<Vec<Expr>>> {
        let mut alts = vec![self.sequence(depth)?];
        while self.peek() == Some('|') {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(depth)?);
        }
        Ok(alts)
    }

    fn sequence(&mut self, depth: usize) -> Res<Vec<Expr>> {
        let nested = depth > 0;
        let mut seq: Vec<Expr> = Vec::new();
        while let Some(c) = self.peek() {
            match c {
                '"' => {
                    self.pos += 1;
                    let mut s = String::new();
                    loop {
                        match self.peek() {
                            None => return self.err("unterminated string literal"),
                            Some('"') => break,
                            Some(_) => s.push(self.char()?),
                        }
                    }
                    self.pos += 1;
                    seq.push(Expr::Lit(s));
                }
                '[' => {
                    self.pos += 1;
                    let negated = self.peek() == Some('^');
                    if negated {
                        self.pos += 1;
                    }
                    let mut ranges = Vec::new();
                    loop {
                        match self.peek() {
                            None => return self.err("unterminated character class"),
                            Some(']') => break,
                            Some(_) => {
                                let lo = self.char()?;
                                let hi = if self.peek() == Some('-')
                                    && self.peek_at(1).is_some_and(|c| c != ']')
                                {
                                    self.pos += 1;
                                    self.char()?
                                } else {
                                    lo
                                };
                                if hi < lo {
                                    return self.err(&format!(
                                        "empty range `{lo}-{hi}` in a character class"
                                    ));
                                }
                                ranges.push((lo, hi));
                            }
                        }
                    }
                    self.pos += 1;
                    if ranges.is_empty() && !negated {
                        return self.err("empty character class `[]` matches nothing");
                    }
                    seq.push(Expr::Class { negated, ranges });
                }
                '.' => {
                    self.pos += 1;
                    seq.push(Expr::Any);
                }
                '(' => {
                    if depth + 1 > MAX_NESTING {
                        return self.err(&format!("parentheses nest deeper than {MAX_NESTING}"));
                    }
                    self.pos += 1;
                    self.space(true);
                    let alts = self.alternates(depth + 1)?;
                    if self.peek() != Some(')') {
                        return self.err("expected `)`");
                    }
                    self.pos += 1;
                    seq.push(Expr::Group(alts));
                }
                '*' | '+' | '?' => {
                    let Some(last) = seq.pop() else {
                        return self.err(&format!("`{c}` follows nothing"));
                    };
                    self.pos += 1;
                    let (min, max) = match c {
                        '*' => (0, None),
                        '+' => (1, None),
                        _ => (0, Some(1)),
                    };
                    seq.push(Expr::Repeat(Box::new(last), min, max));
                }
                '{' => {
                    let Some(last) = seq.pop() else {
                        return self.err("`{` follows nothing");
                    };
                    self.pos += 1;
                    self.space(nested);
                    let min = self.int()?;
                    self.space(nested);
                    let max = match self.peek() {
                        Some('}') => Some(min),
                        Some(',') => {
                            self.pos += 1;
                            self.space(nested);
                            if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                                let m = self.int()?;
                                self.space(nested);
                                Some(m)
                            } else {
                                None
                            }
                        }
                        _ => return self.err("expected `,` or `}` in a repetition"),
                    };
                    if self.peek() != Some('}') {
                        return self.err("expected `}`");
                    }
                    if max.is_some_and(|m| m < min) {
                        return self.err("a repetition's maximum is below its minimum");
                    }
                    self.pos += 1;
                    seq.push(Expr::Repeat(Box::new(last), min, max));
                }
                '<' => return self.err("token references (`<...>`) are not supported"),
                c if Self::is_word(c) => {
                    let at = self.pos;
                    let name = self.name()?;
                    let id = self.rule_id(&name, at);
                    seq.push(Expr::Ref(id));
                }
                _ => break,
            }
            self.space(nested);
        }
        Ok(seq)
    }

    fn int(&mut self) -> Res<u32> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if start == self.pos {
            return self.err("expected a number");
        }
        let s: String = self.chars[start..self.pos].iter().collect();
        match s.parse::<u32>() {
            Ok(n) if n <= MAX_REPEAT => Ok(n),
            _ => Err(self.error_at(
                start,
                &format!("repetition bound {s} is larger than {MAX_REPEAT}"),
            )),
        }
    }

    /// One character of a literal or class, with llama.cpp's escapes.
    fn char(&mut self) -> Res<char> {
        let Some(c) = self.peek() else {
            return self.err("unexpected end of the grammar");
        };
        self.pos += 1;
        if c != '\\' {
            return Ok(c);
        }
        let Some(e) = self.peek() else {
            return self.err("unexpected end after `\\`");
        };
        self.pos += 1;
        let hex = |p: &mut Self, n: usize| -> Res<char> {
            let start = p.pos;
            let digits: String = p
                .chars
                .get(p.pos..p.pos + n)
                .map(|s| s.iter().collect())
                .unwrap_or_default();
            if digits.len() != n || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(p.error_at(start, &format!("expected {n} hex digits")));
            }
            p.pos += n;
            u32::from_str_radix(&digits, 16)
                .ok()
                .and_then(char::from_u32)
                .ok_or_else(|| {
                    p.error_at(start, &format!("\\u{digits} is not a Unicode scalar value"))
                })
        };
        match e {
            'x' => hex(self, 2),
            'u' => hex(self, 4),
            'U' => hex(self, 8),
            't' => Ok('\t'),
            'r' => Ok('\r'),
            'n' => Ok('\n'),
            '\\' | '"' | '[' | ']' => Ok(e),
            other => Err(self.error_at(self.pos - 1, &format!("unknown escape `\\{other}`"))),
        }
    }
}

fn emit_alts(out: &mut String, alts: &[Vec<Expr>], names: &[String]) {
    for (i, seq) in alts.iter().enumerate() {
        if i > 0 {
            out.push_str(" | ");
        }
        emit_seq(out, seq, names);
    }
}

fn emit_seq(out: &mut String, seq: &[Expr], names: &[String]) {
    // An empty sequence (`a ::= "x" |`, `""`, `()`) matches the empty string: `""` in Lark.
    let mut wrote = false;
    for e in seq {
        if matches!(e, Expr::Lit(s) if s.is_empty()) {
            continue;
        }
        if wrote {
            out.push(' ');
        }
        emit(out, e, names);
        wrote = true;
    }
    if !wrote {
        out.push_str("\"\"");
    }
}

fn emit(out: &mut String, e: &Expr, names: &[String]) {
    match e {
        Expr::Lit(s) => {
            for (i, c) in s.chars().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                // Lark strings are JSON strings in llguidance.
                out.push_str(&serde_json::Value::String(c.to_string()).to_string());
            }
            if s.is_empty() {
                out.push_str("\"\"");
            }
        }
        Expr::Class { negated, ranges } => {
            out.push_str("/[");
            if *negated {
                out.push('^');
            }
            if ranges.is_empty() {
                // `[^]`: any character.
                out.push_str("\\x{0}-\\x{10FFFF}");
            }
            for &(lo, hi) in ranges {
                let _ = write!(out, "\\x{{{:X}}}", lo as u32);
                if hi != lo {
                    let _ = write!(out, "-\\x{{{:X}}}", hi as u32);
                }
            }
            out.push_str("]/");
        }
        Expr::Any => out.push_str("/(?s:.)/"),
        Expr::Ref(i) => out.push_str(&lark_name(&names[*i], *i)),
        Expr::Group(alts) => {
            out.push('(');
            emit_alts(out, alts, names);
            out.push(')');
        }
        Expr::Repeat(inner, min, max) => {
            out.push('(');
            emit(out, inner, names);
            out.push(')');
            match (min, max) {
                (0, None) => out.push('*'),
                (1, None) => out.push('+'),
                (0, Some(1)) => out.push('?'),
                (m, None) => {
                    let _ = write!(out, "{{{m},}}");
                }
                (m, Some(n)) if m == n => {
                    let _ = write!(out, "{{{m}}}");
                }
                (m, Some(n)) => {
                    let _ = write!(out, "{{{m},{n}}}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(src: &str) -> (usize, usize, String) {
        match to_lark(src) {
            Err(ConstrainError::Gbnf {
                line,
                column,
                message,
            }) => (line, column, message),
            other => panic!("expected a GBNF error for {src:?}, got {other:?}"),
        }
    }

    #[test]
    fn translates_rules_literals_classes_and_repeats() {
        let g = to_lark(
            "root ::= \"a\\n\" item{2,3} (x | \"\")? # comment\nitem ::= [a-z0-9_] | [^\"\\\\]\nx ::=\n  . \"é\"+\n",
        )
        .unwrap();
        assert_eq!(
            g,
            "start: r0_root\n\
             r0_root: \"a\" \"\\n\" (r1_item){2,3} ((r2_x | \"\"))?\n\
             r1_item: /[\\x{61}-\\x{7A}\\x{30}-\\x{39}\\x{5F}]/ | /[^\\x{22}\\x{5C}]/\n\
             r2_x: /(?s:.)/ (\"é\")+\n"
        );
    }

    #[test]
    fn multi_line_alternatives_inside_parentheses() {
        let g = to_lark("root ::= (\n  \"a\"\n  | \"b\"\n)\n").unwrap();
        assert!(g.contains("r0_root: (\"a\" | \"b\")"), "{g}");
    }

    #[test]
    fn errors_name_the_place() {
        let (l, c, m) = err("root ::= foo\n");
        assert_eq!((l, c, m.as_str()), (1, 10, "undefined rule `foo`"));
        let (l, c, m) = err("root ::= \"a\"\nbar := \"b\"\n");
        assert_eq!((l, c), (2, 5));
        assert!(m.contains("::="), "{m}");
        assert_eq!(err("item ::= \"x\"\n").2, "the grammar has no `root` rule");
        assert!(err("root ::= \"abc\n").2.contains("unterminated"));
        assert!(err("root ::= [abc\n").2.contains("unterminated"));
        assert!(err("root ::= *\n").2.contains("follows nothing"));
        assert!(err("root ::= \"a\"{5000}\n").2.contains("larger than"));
        assert!(err("root ::= \"\\q\"\n").2.contains("unknown escape"));
        assert!(err("root ::= <[1]>\n").2.contains("not supported"));
        assert!(err("root ::= (\"a\"\n").2.contains("`)`"));
        assert!(err("").2.contains("empty"));
        assert!(err("root ::= [z-a]\n").2.contains("empty range"));
        assert!(err(&format!(
            "root ::= {}\"a\"{}\n",
            "(".repeat(100),
            ")".repeat(100)
        ))
        .2
        .contains("nest"));
    }

    #[test]
    fn later_definitions_win_and_rules_may_come_after_use() {
        let g = to_lark("root ::= a\na ::= \"x\"\na ::= \"y\"\n").unwrap();
        assert!(g.contains("r1_a: \"y\"") && !g.contains("\"x\""), "{g}");
    }
}
