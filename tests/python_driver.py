"""Runs a Python 0.2 plugin through the Python SDK's KeyedDriver over a JSON Lines input,
split into batches as the host splits a file, and prints the outputs one a line: what
`groupstate run` writes, if the driver models the host right (tests/it/sessions.rs
compares the two).

    python3 tests/python_driver.py PLUGIN_DIR MODULE CLASS INPUT BATCH_EVENTS DELAY_MS KEY_FIELD TIME_FIELD
"""

import importlib
import json
import sys


def main(argv):
    plugin_dir, module, cls, path, batch_events, delay_ms, key_field, time_field = argv
    sys.path.insert(0, plugin_dir)
    from groupstate_sdk.testing import Batch, KeyedDriver

    plugin = getattr(importlib.import_module(module), cls)
    driver = KeyedDriver(plugin, time_mode="event-time", watermark_delay_ms=int(delay_ms))
    with open(path) as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    size = int(batch_events)
    results = []
    for start in range(0, len(lines), size):
        batch = Batch()
        for line in lines[start : start + size]:
            event = json.loads(line)
            batch.event_at(event[key_field], event[time_field], line)
        results.append(driver.run(batch))
    results.append(driver.run(Batch()))  # The host's last batch fires what the final watermark reached.
    for result in results:
        for key, error in result.errors():
            print(f"error: {key}: {error}", file=sys.stderr)
            return 1
        for output in result.outputs():
            print(output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
