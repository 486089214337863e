//! The error a plugin returns from `init`, `process` and `migrate_state`; the host sees its message.

use std::fmt;

/// Why a plugin call failed. The host receives the message as the WIT `err` string:
/// from `process` it applies the pipeline's error policy to the key, from `init` and
/// `migrate_state` it refuses the plugin. Write messages lowercase, without a trailing
/// period, and say what to do next.
///
/// Any `std::error::Error` converts into it, so `?` works on [`StateError`](crate::StateError),
/// [`ParamError`](crate::ParamError), [`KeyError`](crate::KeyError), `serde_json::Error`
/// and the like; build one from text with [`Error::msg`]. Like `anyhow::Error`, it does
/// not implement `std::error::Error` itself (that would conflict with the conversion).
pub struct Error {
    message: String,
}

impl Error {
    /// An error with the given message.
    pub fn msg(message: impl fmt::Display) -> Self {
        Error { message: message.to_string() }
    }

    /// This error with `context` and a colon in front of its message, such as
    /// `event 3: ...`.
    pub fn context(self, context: impl fmt::Display) -> Self {
        Error { message: format!("{context}: {}", self.message) }
    }

    /// The message, as the host will see it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl<E: std::error::Error> From<E> for Error {
    /// Keeps the error's message and those of its sources, joined by `: `.
    fn from(error: E) -> Self {
        let mut message = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        Error { message }
    }
}

impl From<Error> for String {
    fn from(error: Error) -> Self {
        error.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.message, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_and_adds_context() {
        let parse = "x".parse::<i64>().expect_err("not a number");
        let error = Error::from(parse).context("field `ts`");
        assert_eq!(error.message(), "field `ts`: invalid digit found in string");
        assert_eq!(String::from(Error::msg("boom")), "boom");
    }
}
