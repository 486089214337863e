"""`python3 -m groupstate_sdk wit-path [0.1|0.2]`: where the package's copy of the WIT contract is.

A plugin's build passes it to componentize-py (`--wit-path`), so the bindings always
match the helpers installed beside them.
"""

import sys

from groupstate_sdk import wit_path


def main(argv: list) -> int:
    if argv == ["wit-path"] or (len(argv) == 2 and argv[0] == "wit-path" and argv[1] in ("0.1", "0.2")):
        print(wit_path(*argv[1:]))
        return 0
    print("usage: python3 -m groupstate_sdk wit-path [0.1|0.2]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
