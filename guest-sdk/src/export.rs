//! The glue between the generated WIT exports and a [`StateFunction`]: decoding keys, events and state, encoding outputs. Used by [`export_plugin!`](crate::export_plugin).

use crate::{Error, Event, FromKey, GroupState, KeyError, Params, StateFunction, codec, wit};

/// `info`: the plugin's [`PluginInfo`](crate::PluginInfo) in WIT form.
pub fn info<T: StateFunction>() -> wit::PluginInfo {
    let info = T::info();
    wit::PluginInfo {
        name: info.name.to_string(),
        version: info.version.to_string(),
        state_schema_version: info.state_schema_version,
    }
}

/// `init`: a new instance from the pipeline's parameters.
pub fn init<T: StateFunction>(params: Vec<(String, String)>) -> Result<T, String> {
    T::init(&Params::new(params)).map_err(String::from)
}

/// What a call made before `init` succeeded returns.
pub(crate) const NOT_INITIALISED: &str =
    "process was called before init succeeded: the host must call init on every new instance";

/// `process`: one call for one key, on the instance `init` made.
pub fn process<T: StateFunction>(
    instance: Option<&mut T>,
    key: String,
    events: Vec<wit::Event>,
    state: &wit::GroupState,
) -> Result<Vec<String>, String> {
    let Some(instance) = instance else {
        return Err(NOT_INITIALISED.to_string());
    };
    let key = T::Key::from_key(key).map_err(KeyError::call_message)?;
    let events = events.into_iter().map(|event| (event.event_time_ms, event.payload));
    run_process(instance, &key, events, GroupState::from_host(state)).map_err(String::from)
}

/// `migrate-state`: converts a value written under `from_version` of the state schema
/// into the current one. A value already at the current version is returned unchanged.
pub fn migrate_state<T: StateFunction>(from_version: u32, value: Vec<u8>) -> Result<Vec<u8>, String> {
    if from_version == T::info().state_schema_version {
        return Ok(value);
    }
    let migrated = T::migrate_state(from_version, &value).map_err(String::from)?;
    codec::encode(&migrated).map_err(|error| {
        format!(
            "cannot encode the migrated state ({error}): check the state type's Serialize \
             implementation"
        )
    })
}

/// Decodes the events, calls the plugin, encodes the outputs. Shared by the WIT
/// export, `process-batch` and [`testing`](crate::testing), so that native tests run the
/// same path.
pub(crate) fn run_process<T: StateFunction, P: AsRef<str>>(
    instance: &mut T,
    key: &T::Key,
    events: impl ExactSizeIterator<Item = (Option<i64>, P)>,
    mut state: GroupState<'_, T::State>,
) -> Result<Vec<String>, Error> {
    let events = decode_events::<T::Event, P>(events)?;
    let outputs = instance.process(key, events, &mut state)?;
    outputs
        .iter()
        .enumerate()
        .map(|(index, output)| {
            serde_json::to_string(output).map_err(|error| {
                Error::msg(format_args!(
                    "output {index} cannot be written as JSON ({error}): check the output \
                     type's Serialize implementation"
                ))
            })
        })
        .collect()
}

fn decode_events<E: serde::de::DeserializeOwned, P: AsRef<str>>(
    events: impl ExactSizeIterator<Item = (Option<i64>, P)>,
) -> Result<Vec<Event<E>>, Error> {
    let count = events.len();
    let mut decoded = Vec::with_capacity(count);
    for (index, (time_ms, payload)) in events.enumerate() {
        let value = serde_json::from_str(payload.as_ref()).map_err(|error| {
            Error::msg(format_args!(
                "event {index} of {count}: payload is not a valid {} ({error}): fix the \
                 input, or make the plugin's Event type accept it",
                std::any::type_name::<E>()
            ))
        })?;
        decoded.push(Event { time_ms, value });
    }
    Ok(decoded)
}
