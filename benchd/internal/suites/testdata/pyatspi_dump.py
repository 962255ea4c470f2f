# The a11y suite's peer: a pyatspi dump of the whole desktop, the way
# OSWorld's server builds its accessibility tree (a recursive walk asking
# every node its role, name, description, states, attributes, extents, text,
# value and actions). Runs inside the sandbox on guestd's bus
# (AT_SPI_BUS_ADDRESS). Prints one JSON line per dump: nodes and the
# dump's own milliseconds (Python's start and pyatspi's import excluded).
import json
import sys
import time

import pyatspi

MAX_DEPTH = 50
MAX_WIDTH = 1024


def node(acc, depth):
    n = 1
    try:
        acc.getRoleName()
        acc.name
        acc.description
        acc.getState().getStates()
        acc.getAttributes()
    except Exception:
        return n
    try:
        c = acc.queryComponent()
        c.getPosition(pyatspi.XY_SCREEN)
        c.getSize()
    except NotImplementedError:
        pass
    try:
        t = acc.queryText()
        t.getText(0, t.characterCount)
    except NotImplementedError:
        pass
    try:
        acc.queryValue().currentValue
    except NotImplementedError:
        pass
    try:
        a = acc.queryAction()
        for i in range(a.nActions):
            a.getName(i)
    except NotImplementedError:
        pass
    if depth < MAX_DEPTH:
        for i, child in enumerate(acc):
            if i >= MAX_WIDTH:
                break
            n += node(child, depth + 1)
    return n


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    for _ in range(rounds):
        t0 = time.perf_counter()
        desktop = pyatspi.Registry.getDesktop(0)
        n = node(desktop, 0)
        ms = (time.perf_counter() - t0) * 1000
        print(json.dumps({"nodes": n, "ms": ms}), flush=True)


main()
