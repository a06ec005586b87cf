# Starts localstripe (a fake Stripe, PyPI; a test tool, never shipped) on
# 127.0.0.1 only, on the given port (0: a free one, printed as "PORT n"),
# pickling its store to the given file or, without one, nowhere. Its own
# command line binds every interface and always writes
# /tmp/localstripe.pickle, which parallel runs would share.
import pickle
import socket
import sys

from aiohttp import web
from localstripe import resources
from localstripe.server import app

port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
path = sys.argv[2] if len(sys.argv) > 2 else None


def dump_to_disk(self):
    if path:
        with open(path, "wb") as f:
            pickle.dump(self, f, protocol=pickle.HIGHEST_PROTOCOL)


# The server's middleware saves through this too.
resources.Store.dump_to_disk = dump_to_disk

sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", port))
print("PORT", sock.getsockname()[1], flush=True)
web.run_app(app, sock=sock, print=None)
