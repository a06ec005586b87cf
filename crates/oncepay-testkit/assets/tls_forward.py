"""A TLS server on loopback that forwards every request to an http:// upstream.

Usage: tls_forward.py UPSTREAM CERT KEY. Prints "PORT <n>" once listening.
Used by the tests to put a real TLS endpoint (a test certificate) in front of
the Stripe layer, so `oncepay serve` is shown to reach an https:// provider.
"""
import http.server
import ssl
import sys
import urllib.error
import urllib.request

upstream, cert, key = sys.argv[1], sys.argv[2], sys.argv[3]
FORWARDED = ("authorization", "content-type", "idempotency-key", "stripe-version")


class Forward(http.server.BaseHTTPRequestHandler):
    def forward(self):
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else None
        request = urllib.request.Request(upstream + self.path, data=body, method=self.command)
        for name in FORWARDED:
            if self.headers.get(name):
                request.add_header(name, self.headers[name])
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                status, data = answer.status, answer.read()
        except urllib.error.HTTPError as error:
            status, data = error.code, error.read()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = forward

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forward)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
print("PORT", server.server_address[1], flush=True)
server.serve_forever()
