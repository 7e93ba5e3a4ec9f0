"""The daemon's operations surface seen by independent clients.

- Python grpcio (not our C++ stubs) calls grpc.health.v1.Health/Check and server reflection; the
  messages are encoded and decoded here by hand from the wire format, so nothing of ours is
  trusted to check itself.
- `ckptctl --json` outputs (status, list, describe, health, watch) are parsed and checked.
- The Prometheus endpoint is scraped over HTTP before and after a real checkpoint and a load.
- The admin endpoint over TLS: reachable with the CA, refused in plaintext.
"""

import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest
import urllib.request

import grpc
import torch
from google.protobuf import descriptor_pb2

import ckptd_testutil as util

CKPTCTL = os.path.join(util.BIN_DIR, "ckptctl")


# -- protobuf wire format, just enough for Health and reflection ----------------------------

def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field_bytes(number, payload):
    return varint((number << 3) | 2) + varint(len(payload)) + payload


def parse(buf):
    """[(field number, value)] of one message: ints for varints, bytes for length-delimited."""
    fields, i = [], 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = read_varint(buf, i)
        elif wire == 2:
            n, i = read_varint(buf, i)
            value, i = buf[i:i + n], i + n
        else:
            raise ValueError("unexpected wire type %d" % wire)
        fields.append((number, value))
    return fields


def read_varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def raw(channel, method, streaming=False):
    ident = lambda b: b  # noqa: E731
    if streaming:
        return channel.stream_stream(method, request_serializer=ident, response_deserializer=ident)
    return channel.unary_unary(method, request_serializer=ident, response_deserializer=ident)


SERVING = 1


def health_status(channel):
    reply = raw(channel, "/grpc.health.v1.Health/Check")(b"", timeout=10)
    return dict(parse(reply)).get(1, 0)


def reflection(channel, request):
    call = raw(channel, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", True)
    for reply in call(iter([request]), timeout=10):
        return parse(reply)
    raise AssertionError("no reflection reply")


def scrape(address):
    with urllib.request.urlopen("http://%s/metrics" % address, timeout=10) as r:
        text = r.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


class AdminTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = util.Daemon().start()
        cls.admin = "unix:" + os.path.join(cls.daemon.dir, "admin.sock")
        cls.channel = grpc.insecure_channel(cls.admin)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.daemon.cleanup()

    def ckptctl(self, *args, check=True):
        p = subprocess.run([CKPTCTL, "--admin", self.admin, "--json"] + list(args),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
        if check:
            self.assertEqual(p.returncode, 0, p.stderr)
        return p

    def status(self):
        return json.loads(self.ckptctl("status").stdout)

    def checkpoint(self, job, step, tensors):
        with self.daemon.client(job) as c:
            c.save(step, tensors)
            c.wait(step, "committed", timeout=60)

    # -- gRPC health and reflection, from grpcio ----------------------------------------------

    def test_health_check_is_serving(self):
        self.assertEqual(health_status(self.channel), SERVING)
        # A named service that is not registered with the health service is NOT_FOUND.
        with self.assertRaises(grpc.RpcError) as cm:
            raw(self.channel, "/grpc.health.v1.Health/Check")(field_bytes(1, b"no.such.Service"),
                                                               timeout=10)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_reflection_lists_and_describes_the_services(self):
        reply = reflection(self.channel, field_bytes(7, b""))  # list_services
        listed = [v for n, v in reply if n == 6]                # list_services_response
        self.assertEqual(len(listed), 1)
        names = {dict(parse(s))[1].decode() for n, s in parse(listed[0]) if n == 1}
        self.assertIn("ckptd.v1.Admin", names)
        self.assertIn("grpc.health.v1.Health", names)
        self.assertIn("grpc.reflection.v1alpha.ServerReflection", names)

        # file_containing_symbol: what grpcurl uses to learn the methods.
        reply = reflection(self.channel, field_bytes(4, b"ckptd.v1.Admin"))
        files = [v for n, v in reply if n == 4]  # file_descriptor_response
        self.assertEqual(len(files), 1, reply)
        methods = set()
        for n, blob in parse(files[0]):
            fd = descriptor_pb2.FileDescriptorProto.FromString(blob)
            for service in fd.service:
                if fd.package + "." + service.name == "ckptd.v1.Admin":
                    methods = {m.name for m in service.method}
        self.assertEqual(methods, {"GetStatus", "ListCheckpoints", "DescribeCheckpoint",
                                   "WatchEvents", "PinCheckpoint", "UnpinCheckpoint",
                                   "DeleteCheckpoint", "ReleaseJob"})

    # -- ckptctl --json -----------------------------------------------------------------------

    def test_ckptctl_health_json(self):
        self.assertEqual(json.loads(self.ckptctl("health").stdout),
                         {"address": self.admin, "status": "SERVING", "serving": True})

    def test_ckptctl_status_list_describe(self):
        tensors = {"w": torch.arange(1000, dtype=torch.float32),
                   "b": torch.ones(10, dtype=torch.int64)}
        with self.daemon.client("json-job", 0, 2) as c:
            st = self.status()
            self.assertEqual(st["node_id"], "pytest")
            self.assertEqual(st["role"], "daemon")
            self.assertTrue(st["serving"])
            mine = [x for x in st["clients"] if x["job"] == "json-job"]
            self.assertEqual(len(mine), 1, st["clients"])
            self.assertEqual(mine[0]["pid"], os.getpid())
            self.assertEqual(mine[0]["world_size"], 2)
            config = {e["key"]: e["value"] for e in st["config"]}
            self.assertEqual(config["storage-root"], self.daemon.root)
            pool = st["pool"]
            self.assertEqual(int(pool["total_bytes"]), 256 << 20)
            self.assertEqual(int(pool["total_bytes"]), int(pool["free_bytes"]) +
                             int(pool["cached_bytes"]) + int(pool["in_use_bytes"]))
            c.save(5, tensors)
            c.wait_snapshot(timeout=60)
            step = [s for s in self.status()["steps"] if s["job"] == "json-job"]
            self.assertEqual(len(step), 1)
            self.assertEqual(step[0]["state"], "STEP_STATE_CAPTURING")  # rank 1 has not saved
            self.assertEqual(int(step[0]["bytes_total"]), 1000 * 4 + 10 * 8)
            self.assertEqual(int(step[0]["bytes_captured"]), 1000 * 4 + 10 * 8)

        self.checkpoint("json-list", 3, tensors)
        self.checkpoint("json-list", 7, tensors)
        listed = json.loads(self.ckptctl("list", "json-list").stdout)
        self.assertEqual([int(s) for s in listed["steps"]], [3, 7])
        self.assertEqual(int(listed["latest"]), 7)

        described = json.loads(self.ckptctl("describe", "json-list", "7").stdout)
        m = described["manifest"]
        self.assertEqual(m["job"], "json-list")
        self.assertEqual(int(m["step"]), 7)
        self.assertEqual({t["name"] for t in m["tensors"]}, {"w", "b"})
        self.assertTrue(described["path"].endswith("step-0000000007"))

        missing = self.ckptctl("describe", "json-list", "8", check=False)
        self.assertEqual(missing.returncode, 1)
        self.assertIn("NOT_FOUND", missing.stderr)
        self.assertIn("step 8", missing.stderr)

    def test_ckptctl_watch_json(self):
        watch = subprocess.Popen([CKPTCTL, "--admin", self.admin, "--json", "watch", "--job",
                                  "watch-job"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        events = []
        try:
            # Subscribed once the daemon counts the stream (no event announces it).
            deadline = time.monotonic() + 60
            while self.status()["watch_streams"] < 1:
                self.assertLess(time.monotonic(), deadline, "watch never subscribed")
                time.sleep(0.02)  # polling interval, not synchronisation
            self.checkpoint("watch-job", 1, {"t": torch.zeros(100)})
            # Read until the commit shows: progress samples may come in between on a slow
            # machine (the first one of a step is never held back).
            for line in watch.stdout:
                events.append(json.loads(line))
                if events[-1].get("state_change", {}).get("state") == "STEP_STATE_COMMITTED":
                    break
                self.assertLess(len(events), 1000, "no COMMITTED state change among the events")
        finally:
            watch.kill()
            watch.communicate()
        states = [e["state_change"]["state"] for e in events if "state_change" in e]
        self.assertEqual(states, ["STEP_STATE_CAPTURING", "STEP_STATE_CAPTURED",
                                  "STEP_STATE_PERSISTING", "STEP_STATE_PERSISTED",
                                  "STEP_STATE_COMMITTED"])
        self.assertTrue(all(int(e["unix_time_ms"]) > 0 for e in events))
        self.assertTrue(all("progress" in e for e in events if "state_change" not in e))

    # -- Prometheus ---------------------------------------------------------------------------

    def test_metrics_move_when_a_checkpoint_runs_and_loads(self):
        config = {e["key"]: e["value"] for e in self.status()["config"]}
        address = config["metrics-bound"]
        self.assertTrue(address.startswith("127.0.0.1:"), address)  # loopback
        before = scrape(address)
        self.assertEqual(before['ckptd_build_info{node="pytest",version="0.1.0"}'], 1)
        for family in ("ckptd_pool_bytes{state=\"free\"}", "ckptd_steps_in_flight",
                       "ckptd_last_commit_timestamp_seconds", "ckptd_connected_clients",
                       "ckptd_read_bytes_total{source=\"storage\"}"):
            self.assertIn(family, before)

        tensor = torch.arange(256 * 1024, dtype=torch.float32)  # 1 MiB
        self.checkpoint("metrics-job", 1, {"t": tensor})
        after = scrape(address)
        moved = lambda name: after[name] - before.get(name, 0)  # noqa: E731
        self.assertEqual(moved("ckptd_captured_bytes_total"), tensor.numel() * 4)
        self.assertEqual(moved("ckptd_persisted_bytes_total"), tensor.numel() * 4)
        self.assertEqual(moved("ckptd_steps_committed_total"), 1)
        self.assertEqual(moved("ckptd_capture_duration_seconds_count"), 1)
        self.assertEqual(moved("ckptd_flush_duration_seconds_count"), 1)
        self.assertGreater(after["ckptd_last_commit_timestamp_seconds"], time.time() - 600)

        target = torch.zeros_like(tensor)
        with self.daemon.client("metrics-job") as c:
            c.load({"t": target}, step=1)
        self.assertTrue(torch.equal(target, tensor))
        loaded = scrape(address)
        read = (loaded['ckptd_read_bytes_total{source="memory"}'] +
                loaded['ckptd_read_bytes_total{source="storage"}'] -
                after['ckptd_read_bytes_total{source="memory"}'] -
                after['ckptd_read_bytes_total{source="storage"}'])
        self.assertEqual(read, tensor.numel() * 4)
        self.assertEqual(loaded["ckptd_load_duration_seconds_count"] -
                         after["ckptd_load_duration_seconds_count"], 1)


@unittest.skipUnless(shutil.which("openssl"), "openssl is needed to make a test certificate")
class AdminTlsTest(unittest.TestCase):
    def test_tls_admin_needs_the_ca(self):
        tmp = tempfile.mkdtemp(prefix="ckptd-tls-")
        key, cert = os.path.join(tmp, "key.pem"), os.path.join(tmp, "cert.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=ckptd-admin", "-addext", "subjectAltName=DNS:ckptd-admin",
                        "-keyout", key, "-out", cert], check=True, capture_output=True)
        admin_sock = os.path.join(tmp, "admin.sock")  # where the helper puts it
        d = util.Daemon("--admin-tls-cert", cert, "--admin-tls-key", key, directory=tmp).start()
        try:
            base = [CKPTCTL, "--admin", "unix:" + admin_sock, "--timeout", "5s"]
            ok = subprocess.run(base + ["--tls-ca", cert, "--tls-server-name", "ckptd-admin",
                                        "health"], capture_output=True, text=True, timeout=60)
            self.assertEqual(ok.returncode, 0, ok.stderr)
            self.assertEqual(ok.stdout, "SERVING\n")
            plain = subprocess.run(base + ["health"], capture_output=True, text=True, timeout=60)
            self.assertEqual(plain.returncode, 1)
            self.assertIn("UNREACHABLE", plain.stdout)

            with open(cert, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            channel = grpc.secure_channel("unix:" + admin_sock, creds, options=[
                ("grpc.ssl_target_name_override", "ckptd-admin")])
            self.assertEqual(health_status(channel), SERVING)
            channel.close()
        finally:
            d.stop()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
