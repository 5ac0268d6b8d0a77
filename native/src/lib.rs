//! faultwatch.rules._native: the matcher's fast path for one batch of lines in one call.
//!
//! For the lines of a logs record (their texts and times) it does what the matcher's exact
//! path (rules/engine.py `Matcher._exact_batch`, the reference implementation) does when no
//! rule hits, over the batch as columns: each line's run of prefixes stripped and its rank
//! read (normalise.PREFIX_KINDS, given by Python, as normalise_line reads them), the stripped
//! lines joined (the exact path's own hyperscan database scans them for the error and stage
//! rules, in Python: one call), each rank's last time, and each rank's last progress mark
//! (the progress rules' step/total groups). It declines a batch (`None`) that needs more: a
//! rank prefix in the middle of a line (merged output), a line holding a newline, two
//! progress rules on one line, a progress line that is not ASCII, a step that does not fit
//! 63 bits, a text that is no UTF-8 (a lone surrogate). The exact path then does the whole
//! batch, so a declined batch gives the same result as a taken one would.
//!
//! Every pattern comes from Python (the rule set and normalise.py): no rule or prefix
//! grammar is written here. Patterns are compiled for bytes with ASCII classes and ASCII
//! case folding, as hyperscan runs them; a pattern that does not compile here makes the
//! constructor raise, and the matcher then keeps the exact path.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use regex::bytes::{Regex, RegexBuilder, RegexSet, RegexSetBuilder};
use std::collections::HashMap;

fn build(src: &str, ignore_case: bool, multi_line: bool) -> PyResult<Regex> {
    RegexBuilder::new(src)
        .unicode(false)
        .case_insensitive(ignore_case)
        .multi_line(multi_line)
        .size_limit(64 << 20)
        .dfa_size_limit(64 << 20)
        .build()
        .map_err(|e| PyValueError::new_err(format!("pattern {src:?}: {e}")))
}

struct Progress {
    re: Regex, // the rule's pattern as written (its first match gives the groups)
    step: usize,
    total: Option<usize>,
}

struct Kind {
    re: Regex,           // \A(?:this kind's pattern)
    rank: Option<usize>, // the group of its rank, if it names one
}

#[pyclass(frozen)]
struct FastPath {
    any: RegexSet,    // each kind anchored: which kinds match here (one DFA pass)
    kinds: Vec<Kind>, // in order: the first that matches is the one (leftmost-first)
    max_stack: usize,
    mid: Regex, // a rank prefix in the middle of a stripped line
    prog_set: Option<RegexSet>,
    prog: Vec<Progress>,
}

type Marks = Vec<(usize, Option<i64>, i64, Option<i64>, usize)>;

struct Scan {
    stripped: Vec<u8>, // the lines without their prefixes, joined by "\n"
    ranks: Vec<Option<i64>>,
    last: Vec<(Option<i64>, usize)>, // (rank, its last line) in the order ranks first appear
    marks: Marks,                    // (line, rank, step, total, progress rule index)
}

impl FastPath {
    /// (where the run of prefixes ends, the innermost rank it names or None): a line's
    /// prefixes read one by one as normalise_line reads them (at most max_stack; at each
    /// place the first kind that matches), with a DFA probe first for "none here".
    fn strip(&self, s: &[u8]) -> (usize, Option<i64>) {
        let mut pos = 0;
        let mut rank = None;
        for _ in 0..self.max_stack {
            let rest = &s[pos..];
            let Some(i) = self.any.matches(rest).iter().next() else { break };
            let k = &self.kinds[i];
            let end = match k.rank {
                Some(g) => {
                    let Some(c) = k.re.captures(rest) else { break };
                    if let Some(d) = c.get(g) {
                        rank = std::str::from_utf8(d.as_bytes()).ok().and_then(|d| d.parse().ok());
                    }
                    c.get(0).map_or(0, |m| m.end())
                }
                None => k.re.find(rest).map_or(0, |m| m.end()),
            };
            if end == 0 {
                break;
            }
            pos += end;
        }
        (pos, rank)
    }

    fn scan_lines(&self, lines: &[&[u8]], default_rank: Option<i64>) -> Option<Scan> {
        let n = lines.len();
        let mut buf: Vec<u8> = Vec::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
        let mut starts: Vec<usize> = Vec::with_capacity(n + 1);
        let mut ranks: Vec<Option<i64>> = Vec::with_capacity(n);
        for s in lines {
            if memchr(b'\n', s) {
                return None; // a line holding a newline: the exact path splits it
            }
            let (pos, rank) = self.strip(s);
            let rest = &s[pos..];
            if memchr(b'[', rest) && self.mid.is_match(rest) {
                return None; // merged output: a rank prefix in the middle of a line
            }
            starts.push(buf.len());
            buf.extend_from_slice(rest);
            buf.push(b'\n');
            ranks.push(if pos > 0 { rank.or(default_rank) } else { default_rank });
        }
        starts.push(buf.len());
        if n > 0 {
            buf.pop();
        }
        // each rank's last line, ranks in the order they first appear
        let mut last: Vec<(Option<i64>, usize)> = Vec::new();
        let mut at: HashMap<Option<i64>, usize> = HashMap::new();
        for (i, r) in ranks.iter().enumerate() {
            if let Some(&k) = at.get(r) {
                last[k].1 = i;
            } else {
                at.insert(*r, last.len());
                last.push((*r, i));
            }
        }
        let mut marks: Marks = Vec::new();
        if let Some(set) = &self.prog_set {
            let mut found: Vec<Option<i64>> = Vec::new();
            for i in (0..n).rev() {
                if found.len() == last.len() {
                    break;
                }
                let r = ranks[i];
                if found.contains(&r) {
                    continue;
                }
                let line = &buf[starts[i]..starts[i + 1] - 1];
                let hit = set.matches(line);
                let mut it = hit.iter();
                let Some(pid) = it.next() else { continue };
                if it.next().is_some() || !line.is_ascii() {
                    return None; // two progress rules on one line; a line not ASCII
                }
                let p = &self.prog[pid];
                let Some(c) = p.re.captures(line) else { continue };
                let Some(step) = c.get(p.step) else { continue };
                let step = std::str::from_utf8(step.as_bytes()).ok()?.parse::<i64>().ok()?;
                let total = match p.total.and_then(|g| c.get(g)) {
                    Some(t) if !t.as_bytes().is_empty() => {
                        Some(std::str::from_utf8(t.as_bytes()).ok()?.parse::<i64>().ok()?)
                    }
                    _ => None,
                };
                marks.push((i, r, step, total, pid));
                found.push(r);
            }
            marks.sort_by_key(|m| m.0);
        }
        Some(Scan { stripped: buf, ranks, last, marks })
    }
}

fn memchr(c: u8, s: &[u8]) -> bool {
    s.contains(&c)
}

#[pymethods]
impl FastPath {
    /// prefix_kinds: normalise.PREFIX_KINDS (name, pattern with `rank`/`node` groups);
    /// mid: the rank prefix that must not sit inside a stripped line; progress: (pattern
    /// as the scan reads it, pattern as written, ignore_case) of every progress pattern.
    #[new]
    fn new(
        prefix_kinds: Vec<(String, String)>,
        max_stack: usize,
        mid: &str,
        progress: Vec<(String, String, bool)>,
    ) -> PyResult<Self> {
        let mut alts = Vec::new();
        let mut kinds = Vec::new();
        for (_name, p) in &prefix_kinds {
            let re = build(&format!(r"\A(?:{})", p.replace("(?P<node>", "(?:")), false, false)?;
            let rank = re.capture_names().position(|n| n == Some("rank"));
            kinds.push(Kind { re, rank });
            alts.push(p.replace("(?P<rank>", "(?:").replace("(?P<node>", "(?:"));
        }
        let any = RegexSetBuilder::new(alts.iter().map(|a| format!(r"\A(?:{a})")))
            .unicode(false)
            .size_limit(64 << 20)
            .dfa_size_limit(64 << 20)
            .build()
            .map_err(|e| PyValueError::new_err(format!("prefix patterns: {e}")))?;
        let mut prog = Vec::new();
        let mut loose = Vec::new();
        for (scan_src, src, ic) in &progress {
            let re = build(src, *ic, false)?;
            let names: HashMap<String, usize> = re
                .capture_names()
                .enumerate()
                .filter_map(|(i, n)| n.map(|n| (n.to_string(), i)))
                .collect();
            let step = *names
                .get("step")
                .ok_or_else(|| PyValueError::new_err(format!("pattern {src:?}: no step group")))?;
            prog.push(Progress { re, step, total: names.get("total").copied() });
            loose.push(format!("(?{}:{scan_src})", if *ic { "i" } else { "-i" }));
        }
        let prog_set = if loose.is_empty() {
            None
        } else {
            Some(
                RegexSetBuilder::new(&loose)
                    .unicode(false)
                    .size_limit(64 << 20)
                    .dfa_size_limit(64 << 20)
                    .build()
                    .map_err(|e| PyValueError::new_err(format!("progress patterns: {e}")))?,
            )
        };
        Ok(FastPath {
            any,
            kinds,
            max_stack,
            mid: build(mid, false, false)?,
            prog_set,
            prog,
        })
    }

    /// For one batch (texts, times, default rank): None when the exact path must read it,
    /// else (the stripped lines joined by "\n" as bytes, for the rules' scan; each line's
    /// rank; ((rank, its last time), ...) in first-appearance order; ((line, rank, time,
    /// step, total, progress rule index), ...) in line order).
    #[pyo3(signature = (texts, times, default_rank=None))]
    fn scan<'py>(
        &self,
        py: Python<'py>,
        texts: &Bound<'py, PyList>,
        times: Vec<f64>,
        default_rank: Option<i64>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let n = texts.len();
        if times.len() != n {
            return Err(PyValueError::new_err("texts and times differ in length"));
        }
        let owned: Vec<Bound<'py, PyString>> = texts
            .iter()
            .map(|t| t.cast_into::<PyString>().map_err(PyErr::from))
            .collect::<PyResult<_>>()?;
        let mut lines: Vec<&[u8]> = Vec::with_capacity(n);
        for s in &owned {
            match s.to_str() {
                Ok(t) => lines.push(t.as_bytes()),
                // a text holding a lone surrogate has no UTF-8: the exact path reads it
                Err(_) => return Ok(None),
            }
        }
        let Some(res) = self.scan_lines(&lines, default_rank) else {
            return Ok(None);
        };
        let ranks = PyList::new(py, res.ranks.iter())?;
        let last = PyTuple::new(
            py,
            res.last.iter().map(|(r, i)| (*r, times[*i])),
        )?;
        let marks = PyTuple::new(
            py,
            res.marks
                .iter()
                .map(|(i, r, s, t, p)| (*i, *r, times[*i], *s, *t, *p)),
        )?;
        let stripped = PyBytes::new(py, &res.stripped);
        Ok(Some(PyTuple::new(
            py,
            [stripped.into_any(), ranks.into_any(), last.into_any(), marks.into_any()],
        )?))
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<FastPath>()?;
    Ok(())
}
