#!/usr/bin/env python3
"""Every struct of an earlier release's livereg.h is in today's livereg.h as
it was, grown only at its end: its fields declared the same, in the same
order, first (the text of each declaration, comments and spacing aside),
and, compiled, at the same offsets with the same sizes.

    abi_layouts.py EARLIER_INCLUDE_DIR TODAY_INCLUDE_DIR

abidiff sees the library's types; this sees the header's, as a program
built against either compiles them (libabigail 2.2's suppression of
growth at a struct's end also hides fields reordered within it)."""

import os
import re
import subprocess
import sys
import tempfile


def structs(header):
    """{name: [declaration, ...]} for every `typedef struct NAME { ... } NAME;`."""
    text = re.sub(r"/\*.*?\*/", " ", header, flags=re.S)
    found = {}
    for match in re.finditer(r"typedef struct (\w+) \{(.*?)\}\s*\1;", text, flags=re.S):
        body = match.group(2)
        found[match.group(1)] = [" ".join(d.split()) for d in body.split(";") if d.strip()]
    return found


def field_name(declaration):
    """The declared name: `void (*on_drop)(...)` -> on_drop, `char label[48]` -> label."""
    pointer = re.search(r"\(\s*\*\s*(\w+)\s*\)", declaration)
    if pointer:
        return pointer.group(1)
    return re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", declaration).group(1)


def layout(include_dir, fields):
    """`NAME.FIELD OFFSET SIZE` and `sizeof NAME SIZE` lines, compiled against include_dir."""
    program = ["#include <livereg.h>", "#include <stddef.h>", "#include <stdio.h>", "int main(void) {"]
    for name, declarations in fields.items():
        program.append(f'    printf("sizeof {name} %zu\\n", sizeof({name}));')
        for declaration in declarations:
            field = field_name(declaration)
            program.append(
                f'    printf("{name}.{field} %zu %zu\\n", offsetof({name}, {field}), '
                f"sizeof((({name} *)0)->{field}));"
            )
    program += ["    return 0;", "}"]
    with tempfile.TemporaryDirectory() as work:
        source, binary = os.path.join(work, "layout.c"), os.path.join(work, "layout")
        with open(source, "w") as f:
            f.write("\n".join(program) + "\n")
        subprocess.run(["cc", "-std=c99", "-I", include_dir, source, "-o", binary], check=True)
        out = subprocess.run([binary], check=True, capture_output=True, text=True).stdout
    return dict(line.rsplit(" ", 1) if line.startswith("sizeof") else line.split(" ", 1) for line in out.splitlines())


def main():
    earlier_dir, today_dir = sys.argv[1:3]
    with open(os.path.join(earlier_dir, "livereg.h")) as f:
        earlier = structs(f.read())
    with open(os.path.join(today_dir, "livereg.h")) as f:
        today = structs(f.read())
    problems = []
    for name, declarations in earlier.items():
        now = today.get(name)
        if now is None:
            problems.append(f"{name}: in the earlier header, not in today's")
        elif now[: len(declarations)] != declarations:
            problems.append(f"{name}: expected its fields to begin {declarations}, found {now}")
    if not problems:
        before = layout(earlier_dir, earlier)
        after = layout(today_dir, {name: today[name][: len(d)] for name, d in earlier.items()})
        for key, value in before.items():
            if key.startswith("sizeof "):
                if int(after[key]) < int(value):
                    problems.append(f"{key}: {value} bytes before, {after[key]} now")
            elif after.get(key) != value:
                problems.append(f"{key}: offset and size {value} before, {after.get(key)} now")
    if problems:
        print("struct layouts changed:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print(f"layouts: {len(earlier)} structs of the earlier header, each today's first fields, at the same offsets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
