"""A minimal external metrics API (external.metrics.k8s.io/v1beta1) for the HPA test.

The test cluster has no metrics adapter; this one answers the aggregator with one value per metric,
read from `<dir>/<metric>` on every request, so the test steers the HPA by writing a file.
Usage: external_metrics.py DIR CERT KEY HOST  (prints the bound port on stdout).
"""

import datetime
import http.server
import json
import os
import ssl
import sys

GROUP_VERSION = "external.metrics.k8s.io/v1beta1"


class Handler(http.server.BaseHTTPRequestHandler):
    directory = "."

    def send_json(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def metrics(self):
        return sorted(n for n in os.listdir(self.directory) if not n.startswith("."))

    def do_GET(self):  # noqa: N802 (http.server's name)
        path = self.path.split("?", 1)[0].rstrip("/")
        prefix = "/apis/" + GROUP_VERSION
        if path == prefix:
            resources = [
                {"name": m, "singularName": "", "namespaced": True, "kind": "ExternalMetricValueList", "verbs": ["get"]}
                for m in self.metrics()
            ]
            return self.send_json(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION, "resources": resources})
        parts = path[len(prefix) :].strip("/").split("/")
        if path.startswith(prefix + "/namespaces/") and len(parts) == 3 and parts[2] in self.metrics():
            with open(os.path.join(self.directory, parts[2])) as f:
                value = f.read().strip()
            now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            item = {"metricName": parts[2], "metricLabels": {}, "timestamp": now, "value": value}
            return self.send_json(200, {"kind": "ExternalMetricValueList", "apiVersion": GROUP_VERSION, "metadata": {}, "items": [item]})
        return self.send_json(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})

    def log_message(self, fmt, *args):
        sys.stderr.write("external-metrics: " + fmt % args + "\n")


def main():
    directory, cert, key, host = sys.argv[1:5]
    Handler.directory = directory
    server = http.server.ThreadingHTTPServer((host, 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
