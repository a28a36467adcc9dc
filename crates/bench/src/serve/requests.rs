//! What `tessera bench serve` sends: prompts of random common words (or lines of a file),
//! the deterministic sequence of requests of a measurement ([`RequestGen`]), their JSON
//! bodies, and the seeded Poisson arrivals of `--rate`.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::{Endpoint, OutputLen};

/// Offsets in seconds of `n` Poisson arrivals at `rate` per second: the first at 0, then
/// exponential gaps drawn from a generator seeded with `seed`. An infinite rate gives all
/// zeros.
pub fn arrival_offsets(rate: f64, seed: u64, n: usize) -> Vec<f64> {
    let mut a = Arrivals::new(rate, seed);
    let mut t = 0.0;
    (0..n)
        .map(|i| {
            if i > 0 {
                t += a.next_gap();
            }
            t
        })
        .collect()
}

/// Exponential inter-arrival gaps of a Poisson process.
pub struct Arrivals {
    rng: StdRng,
    rate: f64,
}

impl Arrivals {
    pub fn new(rate: f64, seed: u64) -> Self {
        Arrivals {
            rng: StdRng::seed_from_u64(seed),
            rate,
        }
    }
    /// Seconds to the next arrival.
    pub fn next_gap(&mut self) -> f64 {
        let u: f64 = self.rng.gen(); // [0, 1)
        if self.rate.is_infinite() {
            return 0.0;
        }
        -(1.0 - u).ln() / self.rate
    }
}

/// Common English words that most BPE vocabularies (GPT-2, Llama, SmolLM, Qwen) hold as
/// one token each when preceded by a space, so a prompt of N of them is about N tokens.
#[rustfmt::skip]
pub const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are",
    "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by",
    "word", "but", "not", "what", "all", "were", "we", "when", "your", "can", "said", "there",
    "use", "an", "each", "which", "she", "do", "how", "their", "if", "will", "up", "other",
    "about", "out", "many", "then", "them", "these", "so", "some", "her", "would", "make",
    "like", "him", "into", "time", "has", "look", "two", "more", "write", "go", "see", "number",
    "no", "way", "could", "people", "my", "than", "first", "water", "been", "call", "who",
    "its", "now", "find", "long", "down", "day", "did", "get", "come", "made", "may", "part",
    "over", "new", "sound", "take", "only", "little", "work", "know", "place", "year", "live",
    "me", "back", "give", "most", "very", "after", "thing", "our", "just", "name", "good",
    "man", "think", "say", "great", "where", "help", "through", "much", "before", "line",
    "right", "too", "mean", "old", "any", "same", "tell", "boy", "follow", "came", "want",
    "show", "also", "around", "form", "three", "small", "set", "put", "end", "does", "another",
    "well", "large", "must", "big", "even", "such", "because", "turn", "here", "why", "ask",
    "went", "men", "read", "need", "land", "different", "home", "us", "move", "try", "kind",
    "hand", "picture", "again", "change", "off", "play", "spell", "air", "away", "animal",
    "house", "point", "page", "letter", "mother", "answer", "found", "study", "still", "learn",
    "should", "world", "high", "every", "near", "add", "food", "between", "own", "below",
    "country", "plant", "last", "school", "father", "keep", "tree", "never", "start", "city",
    "earth", "eye", "light", "thought", "head", "under", "story", "saw", "left", "few", "while",
    "along", "might", "close", "something", "seem", "next", "hard", "open", "example", "begin",
    "life", "always", "those", "both", "paper", "together", "got", "group", "often", "run",
    "important", "until", "children", "side", "feet", "car", "mile", "night", "walk", "white",
    "sea", "began", "grow", "took", "river", "four", "carry", "state", "once", "book", "hear",
    "stop", "without", "second", "later",
];

/// A prompt of about `tokens` tokens: that many random words from [`WORDS`].
pub fn build_prompt(rng: &mut impl Rng, tokens: usize) -> String {
    let mut s = String::with_capacity(tokens * 6);
    for i in 0..tokens {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
    }
    s
}

/// Rough token count of a text (for prompts from a file when the server sends no usage).
pub fn estimate_tokens(text: &str) -> usize {
    text.split_whitespace().count()
}

/// One request to send.
#[derive(Debug, Clone, PartialEq)]
pub struct ReqSpec {
    pub index: usize,
    pub prompt: String,
    pub prompt_tokens_est: usize,
    pub max_tokens: usize,
}

/// The deterministic sequence of requests of a measurement: request `i` is the same for
/// a given seed whatever the load or timing.
pub struct RequestGen {
    rng: StdRng,
    prompt_tokens: usize,
    file: Option<Arc<Vec<String>>>,
    output: OutputLen,
    next: usize,
    limit: Option<usize>,
}

impl RequestGen {
    pub fn new(
        seed: u64,
        prompt_tokens: usize,
        file: Option<Arc<Vec<String>>>,
        output: OutputLen,
        limit: Option<usize>,
    ) -> Self {
        RequestGen {
            rng: StdRng::seed_from_u64(seed),
            prompt_tokens,
            file,
            output,
            next: 0,
            limit,
        }
    }
}

impl Iterator for RequestGen {
    type Item = ReqSpec;
    fn next(&mut self) -> Option<ReqSpec> {
        if self.limit.is_some_and(|l| self.next >= l) {
            return None;
        }
        let index = self.next;
        self.next += 1;
        let prompt = match &self.file {
            Some(lines) if !lines.is_empty() => lines[index % lines.len()].clone(),
            _ => build_prompt(&mut self.rng, self.prompt_tokens),
        };
        let max_tokens = match self.output {
            OutputLen::Fixed(n) => n,
            OutputLen::Uniform(lo, hi) => self.rng.gen_range(lo..=hi),
        };
        Some(ReqSpec {
            index,
            prompt_tokens_est: estimate_tokens(&prompt),
            prompt,
            max_tokens,
        })
    }
}

/// The JSON body of a streaming request in `endpoint`'s dialect, asking for exactly
/// `max_tokens` output tokens (`ignore_eos`).
pub fn request_body(
    endpoint: Endpoint,
    model: Option<&str>,
    prompt: &str,
    max_tokens: usize,
    temperature: f64,
) -> Value {
    let mut body = json!({
        "temperature": temperature,
        "stream": true,
        "ignore_eos": true,
    });
    let user = json!([{"role": "user", "content": prompt}]);
    match endpoint {
        Endpoint::Completions => body["prompt"] = json!(prompt),
        Endpoint::Chat => body["messages"] = user,
        Endpoint::Responses => {
            body["input"] = json!(prompt);
            body["store"] = json!(false);
        }
        Endpoint::Messages => body["messages"] = user,
    }
    match endpoint {
        Endpoint::Completions | Endpoint::Chat => {
            body["max_tokens"] = json!(max_tokens);
            body["stream_options"] = json!({"include_usage": true});
        }
        Endpoint::Responses => body["max_output_tokens"] = json!(max_tokens),
        Endpoint::Messages => body["max_tokens"] = json!(max_tokens),
    }
    match model {
        Some(m) => body["model"] = json!(m),
        // Anthropic's API requires a model; a server with one model takes any name.
        None if endpoint == Endpoint::Messages => body["model"] = json!("default"),
        None => {}
    }
    body
}

/// The prompts of a prompt file: a JSON array of strings (prompts spanning lines), else its
/// lines, empty ones skipped.
pub fn prompt_lines(text: &str) -> Vec<String> {
    if let Ok(v) = serde_json::from_str::<Vec<String>>(text) {
        return v.into_iter().filter(|p| !p.trim().is_empty()).collect();
    }
    text.lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_arrivals_are_seeded() {
        let a = arrival_offsets(10.0, 7, 2000);
        assert_eq!(a, arrival_offsets(10.0, 7, 2000));
        assert_ne!(a, arrival_offsets(10.0, 8, 2000));
        assert_eq!(a[0], 0.0);
        assert!(a.windows(2).all(|w| w[1] >= w[0]));
        // Mean gap ≈ 1/rate.
        let mean_gap = a[a.len() - 1] / (a.len() - 1) as f64;
        assert!((mean_gap - 0.1).abs() < 0.01, "{mean_gap}");
        assert!(arrival_offsets(f64::INFINITY, 1, 5)
            .iter()
            .all(|&t| t == 0.0));
    }

    #[test]
    fn prompts_have_the_asked_word_count() {
        let mut r1 = StdRng::seed_from_u64(3);
        let mut r2 = StdRng::seed_from_u64(3);
        let p = build_prompt(&mut r1, 100);
        assert_eq!(p, build_prompt(&mut r2, 100));
        assert_eq!(p.split(' ').count(), 100);
        assert_eq!(estimate_tokens(&p), 100);
        assert!(p.split(' ').all(|w| WORDS.contains(&w)));
        assert!(WORDS
            .iter()
            .all(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase())));
        assert_eq!(build_prompt(&mut r1, 0), "");
    }

    #[test]
    fn request_sequence_is_deterministic() {
        let g = |seed| {
            RequestGen::new(seed, 20, None, OutputLen::Uniform(32, 128), Some(50))
                .collect::<Vec<_>>()
        };
        let a = g(1);
        assert_eq!(a.len(), 50);
        assert_eq!(a, g(1));
        assert_ne!(a, g(2));
        assert!(a.iter().all(|s| (32..=128).contains(&s.max_tokens)));
        assert!(a.iter().enumerate().all(|(i, s)| s.index == i));
        let lines = Arc::new(vec!["a b".to_string(), "c".to_string()]);
        let f: Vec<_> = RequestGen::new(0, 20, Some(lines), OutputLen::Fixed(4), Some(3)).collect();
        assert_eq!(
            f.iter().map(|s| s.prompt.as_str()).collect::<Vec<_>>(),
            ["a b", "c", "a b"]
        );
        assert_eq!(f[0].prompt_tokens_est, 2);
        assert!(
            RequestGen::new(0, 1, None, OutputLen::Fixed(1), None)
                .take(1000)
                .count()
                == 1000
        );
    }
}
