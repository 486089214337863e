"""`python3 -m groupstate_sdk wit-path`: where the package's copy of the WIT contract is.

A plugin's build passes it to componentize-py (`--wit-path`), so the bindings always
match the helpers installed beside them.
"""

import sys

from groupstate_sdk import wit_path


def main(argv: list) -> int:
    if argv == ["wit-path"]:
        print(wit_path())
        return 0
    print("usage: python3 -m groupstate_sdk wit-path", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
