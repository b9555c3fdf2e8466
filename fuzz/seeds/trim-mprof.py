#!/usr/bin/env python3
"""Writes a smaller copy of a .mprof file (make-seeds.sh): its first N
groups of each kind, the stack table cut to their stacks, the end line
recomputed. Usage: trim-mprof.py IN OUT [N]"""
import json
import sys
import zlib

src, dst = sys.argv[1], sys.argv[2]
per_kind = int(sys.argv[3]) if len(sys.argv) > 3 else 6
lines = open(src, "rb").read().split(b"\n")
header = lines[0] + b"\n"
p = json.loads(lines[1])
kept, seen = [], {}
for g in p["groups"]:
    if seen.get(g["kind"], 0) < per_kind:
        seen[g["kind"]] = seen.get(g["kind"], 0) + 1
        kept.append(g)
stacks = p["stacks"]
nodes, new_nodes, node_map, loc_map, new_locs = stacks["nodes"], [], {0: 0}, {}, []


def node(i):
    if i in node_map:
        return node_map[i]
    loc, caller = nodes[i - 1]
    caller = node(caller)
    if loc not in loc_map:
        loc_map[loc] = len(new_locs)
        new_locs.append(stacks["locations"][loc])
    new_nodes.append([loc_map[loc], caller])
    node_map[i] = len(new_nodes)
    return node_map[i]


for g in kept:
    g["stack"] = node(g["stack"])
p["groups"] = kept
strings, string_map = [], {}


def string(i):
    if i is None:
        return None
    if i not in string_map:
        string_map[i] = len(strings)
        strings.append(stacks["strings"][i])
    return string_map[i]


for loc in new_locs:
    loc["module"] = string(loc["module"])
    for f in loc["frames"]:
        for key in ("function", "raw_name", "file"):
            if key in f:
                f[key] = string(f[key])
p["stacks"] = {"strings": strings, "locations": new_locs, "nodes": new_nodes}
body = json.dumps(p, separators=(",", ":")).encode()
crc = zlib.crc32(header + body)
open(dst, "wb").write(header + body + b"\nMEMPROF-END crc32=%08x bytes=%d\n" % (crc, len(body)))
