"""Random JSON schemas within OpenAI's strict structured-output subset.

The subset (OpenAI's "Supported schemas" for strict mode): the root is an
object; every object lists all its properties in `required` and sets
`additionalProperties: false`; types string, number, integer, boolean, null
(as a nullable union), enum, array (items one schema) and nested objects;
nesting depth at most 5 levels (here 3); `anyOf` of such schemas. Each
schema comes with a one-line description a model can be prompted with.

    schemas(seed, count) -> [(description, schema), ...]

Used by tests/server/structured_output_e2e_test.py and
tools/structured_output_bench.py.
"""
import random

WORDS = ["name", "city", "age", "score", "title", "color", "price", "count",
         "active", "tags", "author", "year", "rating", "email", "country",
         "status", "level", "size", "owner", "label"]
ENUMS = [["red", "green", "blue"], ["low", "medium", "high"],
         ["yes", "no"], ["draft", "published", "archived"]]


def _leaf(rng):
    kind = rng.choice(["string", "integer", "number", "boolean", "enum",
                       "nullable", "string"])
    if kind == "enum":
        return {"type": "string", "enum": rng.choice(ENUMS)}
    if kind == "nullable":
        return {"type": [rng.choice(["string", "integer"]), "null"]}
    return {"type": kind}


def _value(rng, depth):
    roll = rng.random()
    if depth < 3 and roll < 0.15:
        return _object(rng, depth + 1)
    if roll < 0.3:
        return {"type": "array", "items": _leaf(rng)}
    if roll < 0.36:
        return {"anyOf": [_leaf(rng), _leaf(rng)]}
    return _leaf(rng)


def _object(rng, depth):
    keys = rng.sample(WORDS, rng.randint(1, 4 if depth > 1 else 5))
    props = {k: _value(rng, depth) for k in keys}
    return {"type": "object", "properties": props, "required": keys,
            "additionalProperties": False}


def schemas(seed, count):
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        schema = _object(rng, 1)
        fields = ", ".join(schema["properties"])
        out.append((f"a record with the fields {fields}", schema))
    return out
