"""The web view: one server-rendered page (schematic, cards, modes, step player, simulator), a JSON API
documented by OpenAPI and a 1 Hz Server-Sent Events stream, all read from the store.

``create_app`` lives in ``hpcwatch.web.app``; it is not imported here so that importing the package
(for its catalogues or the SVG renderer) does not pull in FastAPI.
"""

__all__: list[str] = []
