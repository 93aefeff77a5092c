use std::ffi::OsString;

use crate::error::{ConfigError, LimitExceeded, LimitField};

/// Size limits enforced by every encoder and decoder.
///
/// Build them once (when a node starts) with [`Limits::from_env`] or [`Limits::builder`]; the
/// codecs never read the environment on their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    max_wire_bytes: u64,
    max_metadata_bytes: u64,
    max_buffers: u64,
}

impl Limits {
    /// Environment variable for the largest frame or body, headers included.
    pub const WIRE_BYTES_VAR: &'static str = "PULSING_MAX_TENSOR_WIRE_BYTES";
    /// Environment variable for the largest metadata.
    pub const METADATA_BYTES_VAR: &'static str = "PULSING_MAX_TENSOR_METADATA_BYTES";
    /// Environment variable for the most buffers in one message.
    pub const BUFFERS_VAR: &'static str = "PULSING_MAX_TENSOR_BUFFERS";

    /// Default largest frame: 64 GiB.
    pub const DEFAULT_MAX_WIRE_BYTES: u64 = 64 << 30;
    /// Default largest metadata: 64 MiB.
    pub const DEFAULT_MAX_METADATA_BYTES: u64 = 64 << 20;
    /// Default most buffers: 65,536.
    pub const DEFAULT_MAX_BUFFERS: u64 = 65_536;
    /// Largest PTR1 path slot (actor path or message type): 64 KiB. Not configurable.
    pub const MAX_PATH_BYTES: u64 = 64 << 10;

    /// Reads the three limit variables from the process environment; unset ones get defaults.
    ///
    /// # Errors
    ///
    /// A variable that is set but is not a base-10 unsigned integer (surrounding ASCII
    /// whitespace is allowed) is a [`ConfigError`] naming the variable and the value.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::builder().resolve(|name| std::env::var_os(name))
    }

    /// A builder whose explicit values win over the environment.
    pub fn builder() -> LimitsBuilder {
        LimitsBuilder::default()
    }

    /// Largest frame or body in bytes, headers included.
    pub fn max_wire_bytes(&self) -> u64 {
        self.max_wire_bytes
    }

    /// Largest metadata in bytes.
    pub fn max_metadata_bytes(&self) -> u64 {
        self.max_metadata_bytes
    }

    /// Most buffers in one message.
    pub fn max_buffers(&self) -> u64 {
        self.max_buffers
    }

    /// The longest error text an Error reply carries (4 KiB): longer texts are cut.
    pub const MAX_ERROR_TEXT_BYTES: u64 = 4 << 10;

    /// The limits an Error reply is encoded and decoded with: these limits, raised so that
    /// an error text of up to [`Limits::MAX_ERROR_TEXT_BYTES`] always fits. An Error reply is
    /// a short control answer; a node whose message limits are smaller than its own error
    /// text must still be able to say why it refused a request, instead of closing the
    /// connection without a word.
    pub fn for_error_replies(&self) -> Self {
        let text = Self::MAX_ERROR_TEXT_BYTES;
        Self {
            max_wire_bytes: self.max_wire_bytes.max(text + 64),
            max_metadata_bytes: self.max_metadata_bytes.max(text),
            max_buffers: self.max_buffers,
        }
    }

    /// Checks `value` against the limit on `field`.
    ///
    /// # Errors
    ///
    /// [`LimitExceeded`] naming the field, the value and the limit.
    pub fn check(&self, field: LimitField, value: u64) -> Result<(), LimitExceeded> {
        let limit = match field {
            LimitField::PathBytes => Self::MAX_PATH_BYTES,
            LimitField::MetadataBytes => self.max_metadata_bytes,
            LimitField::BufferCount => self.max_buffers,
            LimitField::WireBytes => self.max_wire_bytes,
            LimitField::BufferBytes => u64::MAX,
        };
        if value > limit {
            Err(LimitExceeded {
                field,
                value,
                limit,
            })
        } else {
            Ok(())
        }
    }
}

impl Default for Limits {
    /// The documented defaults, ignoring the environment.
    fn default() -> Self {
        Self {
            max_wire_bytes: Self::DEFAULT_MAX_WIRE_BYTES,
            max_metadata_bytes: Self::DEFAULT_MAX_METADATA_BYTES,
            max_buffers: Self::DEFAULT_MAX_BUFFERS,
        }
    }
}

/// Builds [`Limits`]: explicit values first, then the environment, then the defaults.
#[derive(Clone, Copy, Debug, Default)]
pub struct LimitsBuilder {
    max_wire_bytes: Option<u64>,
    max_metadata_bytes: Option<u64>,
    max_buffers: Option<u64>,
}

impl LimitsBuilder {
    /// Sets the largest frame or body, ignoring `PULSING_MAX_TENSOR_WIRE_BYTES`.
    pub fn max_wire_bytes(mut self, bytes: u64) -> Self {
        self.max_wire_bytes = Some(bytes);
        self
    }

    /// Sets the largest metadata, ignoring `PULSING_MAX_TENSOR_METADATA_BYTES`.
    pub fn max_metadata_bytes(mut self, bytes: u64) -> Self {
        self.max_metadata_bytes = Some(bytes);
        self
    }

    /// Sets the most buffers, ignoring `PULSING_MAX_TENSOR_BUFFERS`.
    pub fn max_buffers(mut self, count: u64) -> Self {
        self.max_buffers = Some(count);
        self
    }

    /// Explicit values and defaults only; the environment is not read.
    pub fn build(self) -> Limits {
        self.resolve(|_| None).unwrap_or_default()
    }

    /// Explicit values, then the process environment, then defaults.
    ///
    /// # Errors
    ///
    /// See [`Limits::from_env`].
    pub fn build_from_env(self) -> Result<Limits, ConfigError> {
        self.resolve(|name| std::env::var_os(name))
    }

    /// Explicit values, then `lookup(variable)`, then defaults. `lookup` stands in for the
    /// environment (tests pass a map).
    ///
    /// # Errors
    ///
    /// See [`Limits::from_env`].
    pub fn resolve(self, lookup: impl Fn(&str) -> Option<OsString>) -> Result<Limits, ConfigError> {
        let pick = |explicit: Option<u64>, variable: &'static str, default: u64| match explicit {
            Some(value) => Ok(value),
            None => lookup(variable).map_or(Ok(default), |raw| parse_u64(variable, &raw)),
        };
        Ok(Limits {
            max_wire_bytes: pick(
                self.max_wire_bytes,
                Limits::WIRE_BYTES_VAR,
                Limits::DEFAULT_MAX_WIRE_BYTES,
            )?,
            max_metadata_bytes: pick(
                self.max_metadata_bytes,
                Limits::METADATA_BYTES_VAR,
                Limits::DEFAULT_MAX_METADATA_BYTES,
            )?,
            max_buffers: pick(
                self.max_buffers,
                Limits::BUFFERS_VAR,
                Limits::DEFAULT_MAX_BUFFERS,
            )?,
        })
    }
}

fn parse_u64(variable: &'static str, raw: &OsString) -> Result<u64, ConfigError> {
    let error = || ConfigError {
        variable,
        value: raw.to_string_lossy().into_owned(),
        expected: "a base-10 unsigned integer number of bytes or buffers",
    };
    let text = raw.to_str().ok_or_else(error)?.trim_ascii();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(error());
    }
    text.parse().map_err(|_| error())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn unset_variables_give_the_documented_defaults() {
        let sut = Limits::builder().resolve(env(&[])).unwrap();
        assert_eq!(sut.max_wire_bytes(), 68_719_476_736);
        assert_eq!(sut.max_metadata_bytes(), 67_108_864);
        assert_eq!(sut.max_buffers(), 65_536);
        assert_eq!(sut, Limits::default());
    }

    #[test]
    fn set_variables_are_used_and_whitespace_is_trimmed() {
        let sut = Limits::builder()
            .resolve(env(&[
                ("PULSING_MAX_TENSOR_WIRE_BYTES", " 1000\n"),
                ("PULSING_MAX_TENSOR_METADATA_BYTES", "10"),
                ("PULSING_MAX_TENSOR_BUFFERS", "0"),
            ]))
            .unwrap();
        assert_eq!(
            (
                sut.max_wire_bytes(),
                sut.max_metadata_bytes(),
                sut.max_buffers()
            ),
            (1000, 10, 0)
        );
    }

    #[test]
    fn explicit_builder_value_wins_over_the_environment() {
        let sut = Limits::builder()
            .max_buffers(4)
            .resolve(env(&[("PULSING_MAX_TENSOR_BUFFERS", "not even a number")]))
            .unwrap();
        assert_eq!(sut.max_buffers(), 4);
    }

    #[test]
    fn unparsable_value_is_an_error_naming_variable_and_value() {
        for bad in [
            "",
            "-1",
            "1e9",
            "64GiB",
            "0x10",
            "18446744073709551616",
            "+5",
        ] {
            let err = Limits::builder()
                .resolve(env(&[("PULSING_MAX_TENSOR_METADATA_BYTES", bad)]))
                .unwrap_err();
            assert_eq!(err.variable, "PULSING_MAX_TENSOR_METADATA_BYTES");
            assert_eq!(err.value, bad);
            let text = err.to_string();
            assert!(text.contains("PULSING_MAX_TENSOR_METADATA_BYTES"), "{text}");
            assert!(text.contains(&format!("{bad:?}")), "{text}");
        }
    }

    #[test]
    fn limit_error_names_field_value_limit_and_variable() {
        let err = Limits::default()
            .check(LimitField::MetadataBytes, 67_108_865)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "metadata length in bytes is 67108865, over the limit of 67108864 \
             (PULSING_MAX_TENSOR_METADATA_BYTES)"
        );
    }
}
