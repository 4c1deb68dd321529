"""The web dashboard (``/ui``) and the API's own documentation pages (``/docs``, ``/redoc``), all served by the
app itself: nothing loads from another host, so both work on a machine without internet.

The dashboard is static HTML, CSS and plain JavaScript (``api/ui/``) that reads the ``/v1`` API with the
bearer token the user enters, so it shows what that token may see. Swagger UI's and ReDoc's bundles come
from the ``fastapi-offline`` distribution's static folder (Swagger UI: Apache-2.0, ReDoc: MIT), served under
:data:`DOCS_ASSETS`; ReDoc's Google Fonts link is turned off.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter, FastAPI, HTTPException
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles

UI_DIR = Path(__file__).resolve().parent / "ui"
# The pages may load only from this app (ReDoc's footer would fetch its logo from cdn.redoc.ly): the browser
# enforces it (Content Security Policy Level 3, W3C). Swagger UI and ReDoc start from an inline script;
# ReDoc's search runs in a blob: worker.
SAME_ORIGIN = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; "
    "script-src 'self' 'unsafe-inline' blob:; worker-src 'self' blob:; font-src 'self' data:; connect-src 'self'"
}
UI_FILES = {"app.js": "text/javascript", "style.css": "text/css"}
DOCS_ASSETS = "/docs-assets"


def _docs_static() -> Path:
    return Path(str(resources.files("fastapi_offline").joinpath("static")))


def ui_router() -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/ui")
    def dashboard() -> FileResponse:
        return FileResponse(UI_DIR / "index.html", media_type="text/html", headers=SAME_ORIGIN)

    @router.get("/ui/static/{name}")
    def asset(name: str) -> FileResponse:
        if name not in UI_FILES:
            raise HTTPException(404, f"no dashboard file {name!r}; there are: {', '.join(sorted(UI_FILES))}")
        return FileResponse(UI_DIR / name, media_type=UI_FILES[name])

    return router


def mount_docs(app: FastAPI) -> None:
    """``/docs`` and ``/redoc`` from local assets (the app is created with ``docs_url=None, redoc_url=None``)."""
    app.mount(DOCS_ASSETS, StaticFiles(directory=_docs_static()), name="docs-assets")
    openapi = app.openapi_url or "/openapi.json"
    redirect = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    def swagger() -> HTMLResponse:
        return _same_origin(
            get_swagger_ui_html(
                openapi_url=openapi,
                title=f"{app.title} - Swagger UI",
                oauth2_redirect_url=redirect,
                swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
                swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
                swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png",
            )
        )

    @app.get(redirect, include_in_schema=False)
    def swagger_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return _same_origin(
            get_redoc_html(
                openapi_url=openapi,
                title=f"{app.title} - ReDoc",
                redoc_js_url=f"{DOCS_ASSETS}/redoc.standalone.js",
                redoc_favicon_url=f"{DOCS_ASSETS}/favicon.png",
                with_google_fonts=False,
            )
        )


def _same_origin(page: HTMLResponse) -> HTMLResponse:
    page.headers.update(SAME_ORIGIN)
    return page
