//! Stop strings over streamed text.
//!
//! Text is held back while its tail could still be the start of a stop string, so a client
//! never sees part of a stop string; on a match the output ends right before it.

#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
        }
    }

    /// Feeds new text; returns the text safe to emit and whether a stop string matched.
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.pending.push_str(text);
        // Earliest complete match wins.
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Hold back the longest tail that is a proper prefix of some stop string.
        let mut hold = 0;
        for s in &self.stops {
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
    }

    #[test]
    fn false_alarm_is_released() {
        let mut m = StopMatcher::new(&["STOP".to_string()]);
        assert_eq!(m.push("ST"), (String::new(), false));
        assert_eq!(m.push("ART"), ("START".to_string(), false));
        assert_eq!(m.push("ST"), (String::new(), false));
        assert_eq!(m.flush(), "ST");
    }
}
