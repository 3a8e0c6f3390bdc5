#!/usr/bin/env python3
"""vllm-router started with its API key from systemd's credential, never from argv.

The vllm_router role installs this file as bin/vllm-router-launch of the router's venv, with that venv's
python on its #! line. It takes vllm-router's own arguments (any but --api-key), and when the unit names a
credential (VLLM_ROUTER_KEY_CREDENTIAL, the name of LoadCredential=NAME:PATH), reads the key from
$CREDENTIALS_DIRECTORY/NAME: systemd copies the root-only file there for this service alone. The key is
set on the parsed arguments and the router starts in this process, as the vllm-router command would
(vllm_router.launch_router); its title becomes vllm::router. So the key is in no argv (ps, the unit, the
journal's "Started" line), no environment variable and no log line.
"""

import os
import sys

KEY_CREDENTIAL_VARIABLE = "VLLM_ROUTER_KEY_CREDENTIAL"
KEY_FLAG = "--api-key"


class LaunchError(Exception):
    """Why the router cannot start; printed as one line, exit status 2."""


def key_flag_in(argv):
    """The word of argv that would set the key (argparse also takes a unique prefix, such as --api)."""
    for word in argv:
        name = word.split("=", 1)[0]
        if len(name) >= 3 and KEY_FLAG.startswith(name):
            return name
    return None


def read_key(environ):
    """The key from the credential the unit names; None when it names none (a router without a key)."""
    name = environ.get(KEY_CREDENTIAL_VARIABLE)
    if not name:
        return None
    directory = environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        raise LaunchError(f"{KEY_CREDENTIAL_VARIABLE}={name} but no CREDENTIALS_DIRECTORY; expected the unit's "
                          f"LoadCredential={name}:<root-only file>")
    path = os.path.join(directory, name)
    try:
        with open(path, encoding="utf-8") as handle:
            key = handle.read().strip()
    except OSError as exc:
        raise LaunchError(f"cannot read the key credential {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise LaunchError(f"the key credential {path} is not UTF-8 text; expected one printable ASCII word") from None
    if not key or not all("!" <= char <= "~" for char in key):
        raise LaunchError(f"the key credential {path} is empty or holds spaces or non-ASCII characters; expected one "
                          "printable ASCII word")
    return key


def main(argv=None, environ=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    environ = os.environ if environ is None else environ
    try:
        flag = key_flag_in(argv)
        if flag:
            raise LaunchError(f"{flag} is refused on the command line (ps and the journal show it); the key comes "
                              f"from the credential named by {KEY_CREDENTIAL_VARIABLE}")
        key = read_key(environ)
    except LaunchError as exc:
        print(f"vllm-router-launch: {exc}", file=sys.stderr)
        return 2
    from vllm_router.launch_router import launch_router, parse_router_args  # noqa: PLC0415 (only once checked)

    router_args = parse_router_args(argv)
    router_args.api_key = key
    launch_router(router_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
