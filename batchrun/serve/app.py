"""The FastAPI app: OpenAI's Files and Batches paths and shapes over the stores and the runner."""

from __future__ import annotations

import time
import traceback
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from batchrun.serve.batches import TERMINAL, BatchRecord, BatchStore, new_batch
from batchrun.serve.checks import (
    batch_model,
    check_endpoint,
    check_file_endpoint,
    check_metadata,
    expiry_seconds,
    file_expiry,
    window_seconds,
)
from batchrun.serve.errors import ApiError, not_found, without_paths
from batchrun.serve.files import FileStore
from batchrun.serve.guard import TENANT_SCOPE_KEY, Guard, bad_key
from batchrun.serve.ids import new_batch_id, new_error_id
from batchrun.serve.keys import Keys
from batchrun.serve.metrics import Metrics
from batchrun.serve.models_api import model_list, unknown_model
from batchrun.serve.request_ids import (
    CLIENT_SCOPE_KEY,
    SCOPE_KEY,
    RequestIds,
    describe,
    id_headers,
)
from batchrun.serve.runner import Runner
from batchrun.serve.uploads import receive_upload


@dataclass
class Services:
    """What the routes use."""

    files: FileStore
    batches: BatchStore
    runner: Runner
    metrics: Metrics
    # The batch's `model` when no line of its input names one (the served model's name).
    model: str
    # The API keys and their tenants (none: open, on a loopback address only).
    keys: Keys
    max_file_bytes: int
    # Where an unexpected error is logged (the server's log).
    say: Callable[[str], None] = print


class CreateBatch(BaseModel):
    """POST /v1/batches (a field it does not know is refused, naming it, as OpenAI does)."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    output_expires_after: dict[str, Any] | None = None


def create_app(services: Services) -> FastAPI:
    """The app; starting it starts the runner, stopping it stops the runner."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        services.runner.start()
        try:
            yield
        finally:
            services.runner.stop()

    # No redirects: an odd path (a trailing slash, an encoded one) is a 404, never another request.
    app = FastAPI(
        title="batchrun serve",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        redirect_slashes=False,
    )
    _errors(app, services.files.dir.parent, services.say)
    # The key, and a body's size and depth, are checked before any route reads the body.
    app.add_middleware(Guard, keys=services.keys)
    # Outside the guard: its refusals carry a request id too.
    app.add_middleware(RequestIds, say=services.say)
    auth = [Depends(_authorize(services.keys))]
    # The tenant a request's key is (serve/tenants.py): what each route lets it see.
    who = _authorize(services.keys)
    files, batches = services.files, services.batches

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    created = int(time.time())

    @app.get("/v1/models", dependencies=auth)
    def list_models() -> dict[str, Any]:
        return model_list(services.runner.options.settings, created)

    # A path converter: a model's id may hold slashes (`org/model`, an adapter's name).
    @app.get("/v1/models/{model_id:path}", dependencies=auth)
    def get_model(model_id: str) -> dict[str, Any]:
        listed = model_list(services.runner.options.settings, created)["data"]
        for entry in listed:
            if entry["id"] == model_id:
                return dict(entry)
        raise unknown_model(model_id)

    @app.get("/metrics", dependencies=auth, response_class=PlainTextResponse)
    def metrics() -> str:
        return services.metrics.render()

    @app.post("/v1/files", dependencies=auth)
    async def upload(request: Request, tenant: str | None = Depends(who)) -> dict[str, Any]:
        tmp = files.temp_path()
        got = await receive_upload(request, tmp, services.max_file_bytes)
        purpose = got.fields.get("purpose")
        problem = None
        if not got.has_file:
            problem = ApiError(
                400, "the upload has no file (a multipart field named file)", param="file"
            )
        elif purpose != "batch":
            problem = ApiError(400, f"purpose must be 'batch', got {purpose!r}", param="purpose")
        elif got.size == 0:
            problem = ApiError(400, "the file is empty", param="file")
        try:
            expires_after = file_expiry(got.fields)
        except ApiError as e:
            problem = problem or e
        if problem is not None:
            tmp.unlink(missing_ok=True)
            raise problem
        return files.add(tmp, got.filename, "batch", expires_after, owner=tenant)

    @app.get("/v1/files", dependencies=auth)
    def list_files(
        purpose: str | None = None,
        limit: Annotated[int, Query(ge=1, le=10000)] = 10000,
        after: str | None = None,
        order: Literal["asc", "desc"] = "desc",
        tenant: str | None = Depends(who),
    ) -> dict[str, Any]:
        records = files.list(purpose, tenant)
        if order == "asc":
            records.reverse()
        return _page(records, limit, after)

    @app.get("/v1/files/{file_id}", dependencies=auth)
    def get_file(file_id: str, tenant: str | None = Depends(who)) -> dict[str, Any]:
        record = files.get(file_id, tenant)
        if record is None:
            raise not_found("file", file_id)
        return record

    @app.get("/v1/files/{file_id}/content", dependencies=auth)
    def file_content(file_id: str, tenant: str | None = Depends(who)) -> FileResponse:
        record = files.get(file_id, tenant)
        if record is None:
            raise not_found("file", file_id)
        return FileResponse(files.content(file_id), media_type="application/octet-stream")

    @app.delete("/v1/files/{file_id}", dependencies=auth)
    def delete_file(file_id: str, tenant: str | None = Depends(who)) -> dict[str, Any]:
        if not files.delete(file_id, tenant):
            raise not_found("file", file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    @app.post("/v1/batches", dependencies=auth)
    def create_batch(body: CreateBatch, tenant: str | None = Depends(who)) -> dict[str, Any]:
        check_endpoint(body.endpoint)
        window_s = window_seconds(body.completion_window)
        expiry_seconds(body.output_expires_after)  # refused here, used when the output is made
        priority = check_metadata(body.metadata)
        # Another tenant's file is, to this one, a file that does not exist (serve/tenants.py):
        # the same 404.
        record = files.get(body.input_file_id, tenant)
        if record is None:
            raise ApiError(
                404,
                f"No such file: {body.input_file_id!r} (input_file_id)",
                param="input_file_id",
                code="not_found",
            )
        if record.get("purpose") != "batch":
            raise ApiError(
                400,
                f"input file {body.input_file_id!r} has purpose {record.get('purpose')!r}, "
                "not 'batch'",
                param="input_file_id",
            )
        content = files.content(body.input_file_id)
        check_file_endpoint(content, body.endpoint)
        batch = new_batch(
            new_batch_id(),
            body.input_file_id,
            body.endpoint,
            body.completion_window,
            window_s,
            body.metadata,
            batch_model(content) or services.model,
        )
        if body.output_expires_after is not None:
            batch["output_expires_after"] = body.output_expires_after
        new = BatchRecord(batch, priority, owner=tenant)
        batches.add(new)
        services.runner.submit(new.id)
        return _shown(new)

    @app.get("/v1/batches", dependencies=auth)
    def list_batches(
        limit: Annotated[int, Query(ge=1, le=100)] = 20,
        after: str | None = None,
        order: Literal["asc", "desc"] = "desc",
        tenant: str | None = Depends(who),
    ) -> dict[str, Any]:
        page, more = batches.page(limit, after, order, tenant)
        return _listing(page, more)

    @app.get("/v1/batches/{batch_id}", dependencies=auth)
    def get_batch(batch_id: str, tenant: str | None = Depends(who)) -> dict[str, Any]:
        record = batches.get(batch_id, tenant)
        if record is None:
            raise not_found("batch", batch_id)
        return _shown(record)

    @app.post("/v1/batches/{batch_id}/cancel", dependencies=auth)
    def cancel_batch(batch_id: str, tenant: str | None = Depends(who)) -> dict[str, Any]:
        # Decided against the batch's record as it is (runner.cancel): a validating or running
        # batch is cancelling and ends cancelled; a cancelling or finalizing one is answered
        # unchanged; an ended one is OpenAI's 400.
        if batches.get(batch_id, tenant) is None:  # another tenant's: as if there were none
            raise not_found("batch", batch_id)
        cancelled = services.runner.cancel(batch_id)
        if cancelled is not None:
            return _shown(cancelled)
        record = batches.get(batch_id, tenant)
        if record is None:
            raise not_found("batch", batch_id)
        if record.status in TERMINAL:
            raise ApiError(
                400, f"cannot cancel a batch that is {record.status}", code="invalid_state"
            )
        return _shown(record)

    return app


def _shown(record: BatchRecord) -> dict[str, Any]:
    """The Batch object as the API returns it."""
    return dict(record.batch)


def _page(items: list[dict[str, Any]], limit: int, after: str | None) -> dict[str, Any]:
    """One page of a list, OpenAI's cursor style: the items after the one with id `after`."""
    if after is not None:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    return _listing(items[:limit], len(items) > limit)


def _listing(page: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    """A page in OpenAI's list shape."""
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": more,
    }


def _authorize(keys: Keys) -> Callable[[Request], str | None]:
    """The request's tenant, as the guard found it from its key (serve/guard.py); None on a
    server without keys. A request the guard let through without one is refused again here."""

    def check(request: Request) -> str | None:
        tenant = request.scope.get(TENANT_SCOPE_KEY)
        if keys.open():
            return None
        if not isinstance(tenant, str):
            raise bad_key()
        return tenant

    return check


def _errors(app: FastAPI, root: Path, say: Callable[[str], None]) -> None:
    """Every error in OpenAI's shape, naming none of the server's paths (an upload that cannot
    be written says where it was going: the message shows its place inside the root); an
    unexpected one is a JSON 500 with an id, logged with its traceback under that id."""

    def answer(error: ApiError) -> JSONResponse:
        error.message = without_paths(error.message, root)
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, e: ApiError) -> JSONResponse:
        return answer(e)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if e.status_code == 404 else None
        return answer(ApiError(e.status_code, str(e.detail), code=code))

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        return answer(validation_error(e.errors()))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, e: Exception) -> JSONResponse:
        # Answered by Starlette's outermost handler, past RequestIds: the id is added here.
        error_id, scope = new_error_id(), request.scope
        request_id = scope.get(SCOPE_KEY)
        named = (
            f", request {describe(request_id, scope.get(CLIENT_SCOPE_KEY))}"
            if isinstance(request_id, str)
            else ""
        )
        say(
            f"error {error_id} answering {request.method} {request.url.path}{named}:\n"
            + "".join(traceback.format_exception(e))
        )
        response = answer(
            ApiError(
                500,
                f"The server had an error while processing your request (error id {error_id}).",
                code="internal_error",
                kind="server_error",
            )
        )
        for name, value in id_headers(scope):
            response.headers[name.decode()] = value.decode()
        return response


# Where FastAPI says a value came from: the first element of a validation error's `loc`.
_SOURCES = frozenset({"body", "query", "path", "header", "cookie"})


def validation_error(errors: Sequence[Any]) -> ApiError:
    """FastAPI's request validation errors as OpenAI's 400 (the first one): a body that is not
    JSON, or not an object, says so with param null; any other names its field (`metadata.x`,
    `limit`) as param."""
    # An unknown field first: a misspelt one (`completion_windw`) is why its field is missing.
    unknown = [e for e in errors if dict(e).get("type") == "extra_forbidden"]
    first: dict[str, Any] = dict((unknown or list(errors))[0]) if errors else {}
    loc = list(first.get("loc", ()))
    kind, msg = first.get("type"), str(first.get("msg", "invalid request"))
    if kind == "json_invalid":
        # FastAPI's loc is ("body", the character where decoding stopped), not a field.
        reason = str((first.get("ctx") or {}).get("error") or msg)
        at = f" at character {loc[1]}" if len(loc) > 1 and isinstance(loc[1], int) else ""
        return ApiError(400, f"The request body is not valid JSON: {reason}{at}")
    if loc and loc[0] in _SOURCES:
        loc = loc[1:]
    if first.get("loc", ("",))[0] == "body" and not loc:  # the whole body, not one field
        if kind == "missing":
            return ApiError(400, "The request body is missing: send a JSON object")
        if isinstance(first.get("input"), bytes):  # sent with another content type
            return ApiError(400, "The request body must be a JSON object sent as application/json")
        return ApiError(400, f"The request body must be a JSON object: {msg}")
    param = field_path(loc)
    if kind == "extra_forbidden":  # OpenAI's words for a field it does not know
        return ApiError(400, f"Unrecognized request argument supplied: {param}", param=param)
    return ApiError(400, f"{param}: {msg}" if param else msg, param=param or None)


def field_path(loc: Sequence[Any]) -> str:
    """A field's place as a client writes it: `metadata.priority`, `items[0].name`."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path
