//! Stop strings over streamed text.
//!
//! Text is held back while its tail could still be the start of a stop string, so a client
//! never sees part of a stop string; on a match the output ends right before it.

#[derive(Debug, Default)]
pub struct StopMatcher {
    /// The non-empty stop strings, each with its index in the request's list.
    stops: Vec<(usize, String)>,
    pending: String,
    matched: Option<usize>,
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.is_empty())
                .map(|(i, s)| (i, s.clone()))
                .collect(),
            pending: String::new(),
            matched: None,
        }
    }

    /// The index (in the request's list) of the stop string that matched, if one did.
    pub fn matched(&self) -> Option<usize> {
        self.matched
    }

    /// Feeds new text; returns the text safe to emit and whether a stop string matched.
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.pending.push_str(text);
        // Earliest complete match wins (the first listed, of those matching there).
        if let Some((at, i)) = self
            .stops
            .iter()
            .filter_map(|(i, s)| self.pending.find(s.as_str()).map(|at| (at, *i)))
            .min()
        {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            self.matched = Some(i);
            return (out, true);
        }
        // Hold back the longest tail that is a proper prefix of some stop string.
        let mut hold = 0;
        for (_, s) in &self.stops {
            for (i, _) in self.pending.char_indices() {
                let tail = &self.pending[i..];
                if tail.len() < s.len() && s.starts_with(tail) {
                    hold = hold.max(tail.len());
                    break;
                }
            }
        }
        let cut = self.pending.len() - hold;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    /// The held-back text, at the end of the stream.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_across_chunks_without_leaking() {
        let mut m = StopMatcher::new(&["\n\nUser:".to_string()]);
        assert_eq!(m.push("Hello"), ("Hello".to_string(), false));
        assert_eq!(m.push(" world\n"), (" world".to_string(), false));
        assert_eq!(m.push("\nUs"), (String::new(), false));
        assert_eq!(m.push("er: hi"), (String::new(), true));
        assert_eq!(m.matched(), Some(0));
    }

    #[test]
    fn the_earliest_match_is_named_by_its_index() {
        let stops = ["".to_string(), "b".into(), "x".into(), "ab".into()];
        let mut m = StopMatcher::new(&stops);
        assert_eq!(m.matched(), None);
        // "ab" starts before "b": the earliest position wins, whatever the list order.
        assert_eq!(m.push("zab"), ("z".to_string(), true));
        assert_eq!(m.matched(), Some(3));
        let mut m = StopMatcher::new(&["cd".to_string(), "c".into()]);
        // Both start at 1: the first listed.
        assert!(m.push("acd").1);
        assert_eq!(m.matched(), Some(0));
    }

    #[test]
    fn false_alarm_is_released() {
        let mut m = StopMatcher::new(&["STOP".to_string()]);
        assert_eq!(m.push("ST"), (String::new(), false));
        assert_eq!(m.push("ART"), ("START".to_string(), false));
        assert_eq!(m.push("ST"), (String::new(), false));
        assert_eq!(m.flush(), "ST");
        assert_eq!(m.matched(), None);
    }
}
