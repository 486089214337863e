//! The pipeline's parameters given to `init` (`--param name=value` on the host), with typed getters.

use std::any::type_name;
use std::fmt;
use std::str::FromStr;

/// The parameters the host passes to [`StateFunction::init`](crate::StateFunction::init):
/// the pipeline's `--param name=value` pairs, in the order given. When a name is given
/// more than once, the last value wins.
///
/// ```
/// use groupstate_sdk::Params;
///
/// let params = Params::new(vec![("gap_ms".into(), "300000".into())]);
/// let gap_ms: i64 = params.get_or("gap_ms", 600_000)?;
/// let window_ms: i64 = params.get_or("window_ms", 60_000)?;
/// assert_eq!((gap_ms, window_ms), (300_000, 60_000));
/// # Ok::<(), groupstate_sdk::ParamError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Params {
    pairs: Vec<(String, String)>,
}

impl Params {
    /// Wraps `name, value` pairs as the host passes them.
    pub fn new(pairs: Vec<(String, String)>) -> Self {
        Params { pairs }
    }

    /// The raw text of parameter `name`, or `None` when it was not given.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.pairs.iter().rev().find(|(given, _)| given == name).map(|(_, value)| value.as_str())
    }

    /// Parameter `name` parsed as a `T`, or `None` when it was not given; an error when
    /// it was given but does not parse.
    pub fn get<T>(&self, name: &str) -> Result<Option<T>, ParamError>
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        let Some(text) = self.get_str(name) else {
            return Ok(None);
        };
        text.parse().map(Some).map_err(|error: T::Err| ParamError {
            name: name.to_string(),
            problem: format!(
                "is `{text}`, not a valid {ty} ({error}): pass --param {name}=<{ty}>",
                ty = short_type_name::<T>()
            ),
        })
    }

    /// Parameter `name` parsed as a `T`, or `default` when it was not given; an error
    /// when it was given but does not parse.
    pub fn get_or<T>(&self, name: &str, default: T) -> Result<T, ParamError>
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        Ok(self.get(name)?.unwrap_or(default))
    }

    /// Parameter `name` parsed as a `T`; an error when it was not given or does not parse.
    pub fn require<T>(&self, name: &str) -> Result<T, ParamError>
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        self.get(name)?.ok_or_else(|| ParamError {
            name: name.to_string(),
            problem: format!("is required: pass --param {name}=<{}>", short_type_name::<T>()),
        })
    }

    /// Fails on the first parameter whose name is not in `known`, so that a typo such as
    /// `gap-ms` for `gap_ms` is reported instead of silently ignored.
    pub fn reject_unknown(&self, known: &[&str]) -> Result<(), ParamError> {
        let Some((name, _)) = self.pairs.iter().find(|(name, _)| !known.contains(&name.as_str())) else {
            return Ok(());
        };
        Err(ParamError {
            name: name.clone(),
            problem: format!(
                "is not a parameter of this plugin (it knows {}): remove it or fix its name",
                known.join(", ")
            ),
        })
    }

    /// All `name, value` pairs, in the order given.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs.iter().map(|(name, value)| (name.as_str(), value.as_str()))
    }
}

/// A parameter was missing, unknown or did not parse. The message names the parameter
/// and says what it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamError {
    name: String,
    problem: String,
}

impl ParamError {
    /// An error about parameter `name`; `problem` completes the sentence
    /// "parameter `name` ..." and says what to pass instead, such as
    /// `"must be greater than 0, got -5"`.
    pub fn new(name: impl Into<String>, problem: impl Into<String>) -> Self {
        ParamError { name: name.into(), problem: problem.into() }
    }

    /// The name of the parameter at fault.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "parameter `{}` {}", self.name, self.problem)
    }
}

impl std::error::Error for ParamError {}

/// `u64` rather than `core::primitive::u64`; the last path segment is what a user knows.
fn short_type_name<T>() -> &'static str {
    let full = type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> Params {
        Params::new(pairs.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect())
    }

    #[test]
    fn typed_getters() {
        let given = params(&[("gap_ms", "300000"), ("name", "x"), ("ratio", "0.5")]);
        assert_eq!(given.get::<i64>("gap_ms"), Ok(Some(300_000)));
        assert_eq!(given.get::<i64>("absent"), Ok(None));
        assert_eq!(given.get_or("absent", 7u32), Ok(7));
        assert_eq!(given.get_or("ratio", 1.0f64), Ok(0.5));
        assert_eq!(given.require::<String>("name"), Ok("x".to_string()));
        assert_eq!(given.get_str("name"), Some("x"));
        assert_eq!(given.iter().count(), 3);
    }

    #[test]
    fn last_value_wins() {
        let given = params(&[("gap_ms", "1"), ("gap_ms", "2")]);
        assert_eq!(given.get::<i64>("gap_ms"), Ok(Some(2)));
    }

    #[test]
    fn errors_name_the_parameter_and_the_fix() {
        let given = params(&[("gap_ms", "ten"), ("gap-ms", "5")]);
        assert_eq!(
            given.get::<i64>("gap_ms").expect_err("bad number").to_string(),
            "parameter `gap_ms` is `ten`, not a valid i64 (invalid digit found in string): \
             pass --param gap_ms=<i64>"
        );
        assert_eq!(
            given.require::<u32>("window_ms").expect_err("missing").to_string(),
            "parameter `window_ms` is required: pass --param window_ms=<u32>"
        );
        let unknown = given.reject_unknown(&["gap_ms", "window_ms"]).expect_err("typo");
        assert_eq!(unknown.name(), "gap-ms");
        assert_eq!(
            unknown.to_string(),
            "parameter `gap-ms` is not a parameter of this plugin (it knows gap_ms, window_ms): \
             remove it or fix its name"
        );
        assert_eq!(params(&[("gap_ms", "1")]).reject_unknown(&["gap_ms"]), Ok(()));
    }
}
