//! Where a configuration error is: the key's path (`sinks[0].timeout_ms`), and the line and
//! column of that key in the file, or the `ANKUSA_*` variable that set it.
//!
//! The file is read into a `serde_yaml::Value` and deserialized through JSON (see
//! `Config::parse`), which loses positions; the error's path comes from
//! `serde_path_to_error`, and its place from a second, cheap pass over the file's YAML
//! events (`yaml-rust2`, which marks each event with its line and column). Only a refused
//! configuration pays for that pass.

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

/// A key path as the errors write it: `sinks[0].timeout_ms`.
pub(crate) fn render(path: &[Seg]) -> String {
    let mut out = String::new();
    for s in path {
        match s {
            Seg::Key(k) if out.is_empty() => out.push_str(k),
            Seg::Key(k) => {
                out.push('.');
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// A key path from its written form (`sources[0].verify.secret`); `None` for a key that
/// is not one path (`sinks[].url`, a list of keys).
pub(crate) fn parse(key: &str) -> Option<Vec<Seg>> {
    let mut out = Vec::new();
    for part in key.split('.') {
        let (name, mut rest) = part.split_once('[').map_or((part, ""), |(n, r)| (n, r));
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return None;
        }
        out.push(Seg::Key(name.to_owned()));
        while !rest.is_empty() {
            let (index, after) = rest.split_once(']')?;
            out.push(Seg::Index(index.parse().ok()?));
            rest = after.strip_prefix('[').unwrap_or(after);
            if !after.is_empty() && !after.starts_with('[') {
                return None;
            }
        }
    }
    Some(out)
}

/// The path of a `serde_path_to_error` error (an enum's variant is the key YAML writes it
/// as: `tenant: {header: …}`).
pub(crate) fn of_error(path: &serde_path_to_error::Path) -> Vec<Seg> {
    use serde_path_to_error::Segment;
    path.iter()
        .filter_map(|s| match s {
            Segment::Seq { index } => Some(Seg::Index(*index)),
            Segment::Map { key } => Some(Seg::Key(key.clone())),
            Segment::Enum { variant } => Some(Seg::Key(variant.clone())),
            Segment::Unknown => None,
        })
        .collect()
}

/// The line and column (both from 1) of `path` in `text`: of its value if that is a
/// scalar, else of its key (a list's item: where the item starts). `None` when the text does
/// not hold that path (it came from a default or a variable) or does not parse.
pub(crate) fn line_col(text: &str, path: &[Seg]) -> Option<(usize, usize)> {
    let mut walk = Walk {
        target: path,
        stack: Vec::new(),
        found: None,
    };
    Parser::new_from_str(text).load(&mut walk, false).ok()?;
    walk.found.map(|m| (m.line(), m.col() + 1))
}

enum Kind {
    /// A mapping: the key whose value comes next, or `None` when a key comes next.
    Map(Option<String>),
    /// A sequence: the index of its next item.
    Seq(usize),
}

struct Frame {
    /// Where the container is in its parent (`None`: the document's root).
    at: Option<Seg>,
    kind: Kind,
}

struct Walk<'a> {
    target: &'a [Seg],
    stack: Vec<Frame>,
    found: Option<Marker>,
}

impl Walk<'_> {
    /// Where the next value goes in the innermost container.
    fn next_at(&self) -> Option<Seg> {
        match &self.stack.last()?.kind {
            Kind::Map(Some(k)) => Some(Seg::Key(k.clone())),
            Kind::Map(None) => None,
            Kind::Seq(i) => Some(Seg::Index(*i)),
        }
    }

    /// Whether the path of the containers, then `last`, is the target.
    fn is_target(&self, last: Option<&Seg>) -> bool {
        let mut path = self.stack.iter().filter_map(|f| f.at.as_ref()).chain(last);
        let mut want = self.target.iter();
        loop {
            match (path.next(), want.next()) {
                (None, None) => return true,
                (Some(a), Some(b)) if a == b => {}
                _ => return false,
            }
        }
    }

    /// A value ended: its container moves on.
    fn value_done(&mut self) {
        match self.stack.last_mut().map(|f| &mut f.kind) {
            Some(Kind::Map(k)) => *k = None,
            Some(Kind::Seq(i)) => *i += 1,
            None => {}
        }
    }
}

impl MarkedEventReceiver for Walk<'_> {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        let key_next = matches!(
            self.stack.last(),
            Some(Frame {
                kind: Kind::Map(None),
                ..
            })
        );
        match ev {
            Event::Scalar(v, ..) if key_next => {
                if self.found.is_none() && self.is_target(Some(&Seg::Key(v.clone()))) {
                    self.found = Some(mark);
                }
                if let Some(Frame {
                    kind: Kind::Map(k), ..
                }) = self.stack.last_mut()
                {
                    *k = Some(v);
                }
            }
            Event::Scalar(..) | Event::Alias(..) => {
                if self.is_target(self.next_at().as_ref()) {
                    self.found = Some(mark);
                }
                self.value_done();
            }
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                // A mapping or a list is where its key is, if it has one.
                let at = self.next_at();
                if self.found.is_none() && self.is_target(at.as_ref()) {
                    self.found = Some(mark);
                }
                let kind = match ev {
                    Event::MappingStart(..) => Kind::Map(None),
                    _ => Kind::Seq(0),
                };
                self.stack.push(Frame { at, kind });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
                self.value_done();
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
data_dir: /d
tenants:
  max: 0
sinks:
  - id: a
    url: http://a/
  - { id: b, url: 'http://b/', timeout_ms: 5s }
sources:
  - id: s
    tenant:
      header: x-tenant
";

    fn at(key: &str) -> Option<(usize, usize)> {
        line_col(TEXT, &parse(key).unwrap())
    }

    #[test]
    fn a_key_path_is_found_at_its_value() {
        assert_eq!(at("tenants.max"), Some((3, 8)));
        assert_eq!(at("sinks[1].timeout_ms"), Some((7, 44)));
        assert_eq!(at("sinks[0]"), Some((5, 7)));
        assert_eq!(at("sinks[0].url"), Some((6, 10)));
        assert_eq!(at("sources[0].tenant.header"), Some((11, 15)));
        assert_eq!(at("sources[0].tenant"), Some((10, 5)));
        assert_eq!(at("data_dir"), Some((1, 11)));
        // Not in the text: a default, or a variable's.
        assert_eq!(at("dispatch.tick_interval_ms"), None);
        assert_eq!(at("sinks[2]"), None);
        assert_eq!(line_col("a: [", &parse("a").unwrap()), None);
    }

    #[test]
    fn key_paths_round_trip_through_their_written_form() {
        for k in [
            "tenants.max",
            "sinks[1].timeout_ms",
            "a[0][2].b",
            "data_dir",
        ] {
            assert_eq!(render(&parse(k).unwrap()), k);
        }
        for k in [
            "sinks[].url",
            "a..b",
            "a[x]",
            "a[0]b",
            "cluster.token (printable)",
        ] {
            assert_eq!(parse(k), None, "{k}");
        }
    }
}
