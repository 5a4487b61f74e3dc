//! Stop strings matched across token boundaries: text is held back while it could still be the start
//! of a stop string, and a stop string itself is never emitted.

/// Incremental stop-string matcher over streamed text.
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

/// What [`StopMatcher::push`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum StopResult {
    /// Text safe to emit; generation continues.
    Continue(String),
    /// A stop string was matched: the text before it, then generation ends.
    Stop {
        /// Text before the stop string.
        text: String,
        /// The stop string that matched.
        stop: String,
    },
}

impl StopMatcher {
    /// A matcher for the given (non-empty) stop strings.
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
        }
    }

    /// Feeds new text.
    pub fn push(&mut self, text: &str) -> StopResult {
        self.pending.push_str(text);
        if let Some((at, i)) = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| self.pending.find(s.as_str()).map(|at| (at, i)))
            .min()
        {
            let text = self.pending[..at].to_string();
            self.pending.clear();
            return StopResult::Stop {
                text,
                stop: self.stops[i].clone(),
            };
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1) {
                if i > keep && self.pending.ends_with(&s[..i]) {
                    keep = i;
                }
            }
        }
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        StopResult::Continue(out)
    }

    /// The held-back text, at the end of generation.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stop(text: &str, stop: &str) -> StopResult {
        StopResult::Stop {
            text: text.into(),
            stop: stop.into(),
        }
    }

    #[test]
    fn matches_across_pushes_and_never_emits_the_stop() {
        let mut m = StopMatcher::new(&["</end>".to_string()]);
        assert_eq!(m.push("hello </"), StopResult::Continue("hello ".into()));
        assert_eq!(m.push("en"), StopResult::Continue("".into()));
        assert_eq!(m.push("d> tail"), stop("", "</end>"));
    }

    #[test]
    fn releases_false_starts() {
        let mut m = StopMatcher::new(&["STOP".to_string()]);
        assert_eq!(m.push("ST"), StopResult::Continue("".into()));
        assert_eq!(m.push("ART"), StopResult::Continue("START".into()));
        assert_eq!(m.push("xS"), StopResult::Continue("x".into()));
        assert_eq!(m.finish(), "S");
    }

    #[test]
    fn earliest_stop_wins_and_unicode_is_safe() {
        let mut m = StopMatcher::new(&["b".into(), "ab".into(), "é!".into()]);
        assert_eq!(m.push("xxab"), stop("xx", "ab"));
        let mut m = StopMatcher::new(&["é!".into()]);
        assert_eq!(m.push("caf"), StopResult::Continue("caf".into()));
        assert_eq!(m.push("é"), StopResult::Continue("".into()));
        assert_eq!(m.push("!"), stop("", "é!"));
    }
}
