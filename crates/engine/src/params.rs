//! The accepted range of every generation parameter, in one place: [`GenerateRequest::validate`]
//! is the one check every front end runs (`tessera generate` through [`crate::generate`] and
//! the step engine, `tessera serve` before it admits a request), so the CLI and the server
//! accept and refuse the same values with the same messages. Each error names its parameter
//! and quotes the range actually enforced.

use std::fmt;

use crate::request::GenerateRequest;
use crate::sampling::SamplingParams;

/// A parameter outside its range: which one, and a message quoting the range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamError {
    pub param: &'static str,
    pub message: String,
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ParamError {}

/// An integer parameter's closed range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntRange {
    pub param: &'static str,
    pub min: i64,
    pub max: i64,
}

impl IntRange {
    /// `v` if it is in range; an error quoting the range otherwise.
    pub fn check(&self, v: i64) -> Result<i64, ParamError> {
        if (self.min..=self.max).contains(&v) {
            Ok(v)
        } else {
            Err(ParamError {
                param: self.param,
                message: format!(
                    "{} must be between {} and {} (got {v})",
                    self.param, self.min, self.max
                ),
            })
        }
    }

    /// The same range under another parameter name (e.g. `top_logprobs` for `logprobs`).
    pub const fn named(self, param: &'static str) -> IntRange {
        IntRange { param, ..self }
    }
}

/// A real parameter's range; `min_open` excludes the lower bound.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FloatRange {
    pub param: &'static str,
    pub min: f64,
    pub max: f64,
    pub min_open: bool,
}

impl FloatRange {
    pub fn check(&self, v: f64) -> Result<f64, ParamError> {
        let above_min = if self.min_open {
            v > self.min
        } else {
            v >= self.min
        };
        if v.is_finite() && above_min && v <= self.max {
            return Ok(v);
        }
        let range = if self.min_open {
            format!("greater than {} and at most {}", self.min, self.max)
        } else {
            format!("between {} and {}", self.min, self.max)
        };
        Err(ParamError {
            param: self.param,
            message: format!("{} must be {range} (got {v})", self.param),
        })
    }
}

/// Tokens one request may ask for (the context usually ends it sooner).
pub const MAX_TOKENS: IntRange = IntRange {
    param: "max_tokens",
    min: 1,
    max: 1 << 20,
};
/// Top alternatives reported per token.
pub const LOGPROBS: IntRange = IntRange {
    param: "logprobs",
    min: 0,
    max: 20,
};
/// Priority classes (lower runs first).
pub const PRIORITY: IntRange = IntRange {
    param: "priority",
    min: -1000,
    max: 1000,
};
/// Drafted tokens verified per step for one request (0: no speculation).
pub const SPEC_TOKENS: IntRange = IntRange {
    param: "spec_tokens",
    min: 0,
    max: 64,
};
/// Most stop strings per request.
pub const MAX_STOP_STRINGS: usize = 16;
/// OpenAI's range; 0 is greedy.
pub const TEMPERATURE: FloatRange = FloatRange {
    param: "temperature",
    min: 0.0,
    max: 2.0,
    min_open: false,
};
pub const TOP_P: FloatRange = FloatRange {
    param: "top_p",
    min: 0.0,
    max: 1.0,
    min_open: true,
};
pub const MIN_P: FloatRange = FloatRange {
    param: "min_p",
    min: 0.0,
    max: 1.0,
    min_open: false,
};
pub const REPETITION_PENALTY: FloatRange = FloatRange {
    param: "repetition_penalty",
    min: 0.0,
    max: 10.0,
    min_open: true,
};
pub const PRESENCE_PENALTY: FloatRange = FloatRange {
    param: "presence_penalty",
    min: -2.0,
    max: 2.0,
    min_open: false,
};
pub const FREQUENCY_PENALTY: FloatRange = FloatRange {
    param: "frequency_penalty",
    min: -2.0,
    max: 2.0,
    min_open: false,
};

/// OpenAI's `logit_bias` values.
pub const LOGIT_BIAS: FloatRange = FloatRange {
    param: "logit_bias",
    min: -100.0,
    max: 100.0,
    min_open: false,
};
/// Most `logit_bias` entries per request (OpenAI's limit).
pub const MAX_LOGIT_BIAS: usize = 300;

impl SamplingParams {
    /// Checks every sampling parameter's range; the error names the parameter.
    pub fn validate(&self) -> Result<(), ParamError> {
        TEMPERATURE.check(self.temperature as f64)?;
        TOP_P.check(self.top_p as f64)?;
        MIN_P.check(self.min_p as f64)?;
        REPETITION_PENALTY.check(self.repetition_penalty as f64)?;
        PRESENCE_PENALTY.check(self.presence_penalty as f64)?;
        FREQUENCY_PENALTY.check(self.frequency_penalty as f64)?;
        Ok(())
    }
}

impl GenerateRequest {
    /// Checks every parameter of the request (not the prompt, whose limits are the model's
    /// and the server's): the one validation all front ends share.
    pub fn validate(&self) -> Result<(), ParamError> {
        MAX_TOKENS.check(i64::try_from(self.max_tokens).unwrap_or(i64::MAX))?;
        self.params.validate()?;
        if self.stop.len() > MAX_STOP_STRINGS {
            return Err(ParamError {
                param: "stop",
                message: format!(
                    "at most {MAX_STOP_STRINGS} stop strings (got {})",
                    self.stop.len()
                ),
            });
        }
        if self.stop.iter().any(|s| s.is_empty()) {
            return Err(ParamError {
                param: "stop",
                message: "stop strings must not be empty".into(),
            });
        }
        if let Some(n) = self.logprobs {
            LOGPROBS.check(i64::try_from(n).unwrap_or(i64::MAX))?;
        }
        PRIORITY.check(self.priority as i64)?;
        if let Some(k) = self.spec_tokens {
            SPEC_TOKENS.check(i64::try_from(k).unwrap_or(i64::MAX))?;
        }
        if self.logit_bias.len() > MAX_LOGIT_BIAS {
            return Err(ParamError {
                param: "logit_bias",
                message: format!(
                    "logit_bias takes at most {MAX_LOGIT_BIAS} entries (got {})",
                    self.logit_bias.len()
                ),
            });
        }
        for &(_, b) in &self.logit_bias {
            LOGIT_BIAS.check(b as f64)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(edit: impl FnOnce(&mut GenerateRequest)) -> Result<(), ParamError> {
        let mut r = GenerateRequest {
            prompt_ids: vec![1],
            max_tokens: 8,
            ..Default::default()
        };
        edit(&mut r);
        r.validate()
    }

    #[test]
    fn each_range_is_enforced_at_its_bounds_and_named() {
        assert_eq!(req(|_| {}), Ok(()));
        assert_eq!(req(|r| r.params.temperature = 2.0), Ok(()));
        assert_eq!(req(|r| r.max_tokens = 1 << 20), Ok(()));
        assert_eq!(req(|r| r.params.top_p = 1.0), Ok(()));
        assert_eq!(req(|r| r.params.repetition_penalty = 10.0), Ok(()));
        assert_eq!(
            req(|r| r.logit_bias = (0..300).map(|t| (t, -100.0)).collect()),
            Ok(())
        );
        for (edit, param) in [
            (
                Box::new(|r: &mut GenerateRequest| r.params.temperature = 2.5)
                    as Box<dyn FnOnce(&mut GenerateRequest)>,
                "temperature",
            ),
            (Box::new(|r| r.params.temperature = f32::NAN), "temperature"),
            (Box::new(|r| r.params.top_p = 0.0), "top_p"),
            (Box::new(|r| r.params.min_p = 1.5), "min_p"),
            (
                Box::new(|r| r.params.repetition_penalty = 0.0),
                "repetition_penalty",
            ),
            (
                Box::new(|r| r.params.presence_penalty = -2.5),
                "presence_penalty",
            ),
            (
                Box::new(|r| r.params.frequency_penalty = 3.0),
                "frequency_penalty",
            ),
            (Box::new(|r| r.max_tokens = 0), "max_tokens"),
            (Box::new(|r| r.max_tokens = (1 << 20) + 1), "max_tokens"),
            (Box::new(|r| r.stop = vec![String::new()]), "stop"),
            (Box::new(|r| r.stop = vec!["x".into(); 17]), "stop"),
            (Box::new(|r| r.logprobs = Some(21)), "logprobs"),
            (Box::new(|r| r.priority = 1001), "priority"),
            (Box::new(|r| r.logit_bias = vec![(1, 100.5)]), "logit_bias"),
            (
                Box::new(|r| r.logit_bias = vec![(1, f32::NAN)]),
                "logit_bias",
            ),
            (
                Box::new(|r| r.logit_bias = (0..301).map(|t| (t, 1.0)).collect()),
                "logit_bias",
            ),
        ] {
            let e = req(edit).unwrap_err();
            assert_eq!(e.param, param, "{e}");
            assert!(e.message.starts_with(param) || param == "stop", "{e}");
        }
    }

    #[test]
    fn messages_quote_the_enforced_range() {
        assert_eq!(
            MAX_TOKENS.check(0).unwrap_err().message,
            "max_tokens must be between 1 and 1048576 (got 0)"
        );
        assert_eq!(
            TOP_P.check(0.0).unwrap_err().message,
            "top_p must be greater than 0 and at most 1 (got 0)"
        );
        assert_eq!(
            TEMPERATURE.check(3.0).unwrap_err().message,
            "temperature must be between 0 and 2 (got 3)"
        );
    }
}
