"""The engines that come with ftcluster, and the one a model spec without `backend` names.

Only ftcluster/engines/ names an engine: the registry (ftcluster.spec.engines, in the spec
layer below this one) reads this table by its module's name when first asked, so the spec
layer imports nothing of the engines' and the registry itself stays the same for every engine.
"""

# The engine a model spec is served by when it names none in `backend` (every spec written
# before there was a second engine is FasterTransformer's).
DEFAULT = "fastertransformer"

# A name and "module:attribute", as the `ftcluster.engines` entry points declare another
# package's engines (the built-in ones are not entry points: an editable install's metadata and
# importlib.metadata's scan of every installed package are not on the way to a plan).
BUILT_IN: dict[str, str] = {
    DEFAULT: "ftcluster.engines.fastertransformer:ENGINE",
}
