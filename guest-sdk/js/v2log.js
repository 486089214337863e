// Logging for 0.2 plugins (`groupstate-sdk/v2/log`): the host's log, tagged with the
// plugin's name and key, limited per call (`log_bytes_per_call_max`).
import { log as hostLog } from 'groupstate:plugin/log@0.2.0';

/** Writes `message` to the host's log at `level` (`trace`, `debug`, `info`, `warn`, `error`). */
export function log(level, message) {
  hostLog(level, String(message));
}
