"""IPC layer: the image a ``generate_request`` may carry (protocol 1.1), and its checks before any decoder runs.

``Image`` is the wire value (structure only: format, bytes, size). ``check_image`` is what the daemon does
before the image reaches the vision encoder: the bytes must be what the format says and the work of decoding them
bounded by the size the header declares, so that a decompression bomb or a mislabelled file is refused without
decoding it (the decoder, stb_image inside mtmd, inflates a PNG's whole zlib stream, whatever the header says, and
decodes every scan of a JPEG over the whole frame):

- the declared size within the limits: ``max_image_side_px``, ``max_image_pixels``, and ``max_image_decoded_bytes``
  (width x height x channels x bytes per sample, what the decoder allocates for the pixels);
- PNG: the signature, ``IHDR`` first with a colour type and bit depth the format defines, the chunks (at most
  ``max_image_chunks``) whole up to ``IEND``, no critical chunk other than ``PLTE``, ``IDAT``, ``IEND``, and the
  zlib stream of the ``IDAT`` chunks inflating to exactly the bytes the header declares (every row's filter byte
  and samples, per Adam7 pass when interlaced). The stream is inflated a bounded piece at a time and the output
  dropped (constant memory), and refused as soon as it runs past the declared size: a bomb costs the declared
  size's inflate at most. Ancillary chunks (``zTXt``, ``iCCP``, ``iTXt``: compressed text and profiles) are skipped
  unread, as the decoder skips them;
- JPEG: the SOI marker, the marker segments (at most ``max_image_chunks``) whole, one frame header of a coding the
  decoder reads (baseline, extended or progressive Huffman, 8-bit samples, 1, 3 or 4 components, sampling factors
  1 to 4), and scans that code the frame the way its process does. The decoder's work is the frame's blocks once
  per scan, whatever the scan's data (it reads a scan cut short as zeros): a sequential JPEG codes each component in
  one scan, and a progressive one has at most ``max_image_scans``. The scans' entropy-coded data is searched for
  the next marker, not decoded;
- raw pixels: exactly width x height x 3 or 4 bytes.

Pure: no I/O, no imaging library (zlib only).
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from igi_sdk.ipc.values import WireModel

ImageFormat = Literal["png", "jpeg", "rgb8", "rgba8"]
IMAGE_FORMATS: tuple[str, ...] = ("png", "jpeg", "rgb8", "rgba8")
MAX_IMAGE_SIDE_PX = 4096
"""Longest side of an image, pixels (protocol 1.1, section 10)."""
MAX_IMAGE_PIXELS = 4096 * 2304
"""Most pixels of an image (a 4K frame; protocol 1.1, section 10)."""
MAX_IMAGE_DECODED_BYTES = 4096 * 2304 * 4
"""Most bytes an image's pixels decode to, width x height x channels x bytes per sample (a 4K frame of 8-bit RGBA;
protocol 1.2, section 10)."""
MAX_IMAGE_CHUNKS = 4096
"""Most chunks of a PNG, or marker segments of a JPEG (protocol 1.2, section 10)."""
MAX_IMAGE_SCANS = 32
"""Most scans of a progressive JPEG (protocol 1.2, section 10); an encoder writes about 10."""
INFLATE_STEP_BYTES = 1 << 18
"""Most bytes one step of the check's inflate produces (and holds) at a time."""
_CHANNELS = {"rgb8": 3, "rgba8": 4}
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}  # colour type: bit depths
_PNG_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type: samples per pixel
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # start-of-frame markers (not DHT, JPG, DAC)
_JPEG_SOF_DECODED = frozenset((0xC0, 0xC1, 0xC2))  # baseline, extended, progressive Huffman: what stb_image reads
_JPEG_NO_LENGTH = frozenset((0x01, *range(0xD0, 0xD8)))  # TEM, RSTn: markers without a length
_JPEG_MARKER_IN_SCAN = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")  # not a stuffed 0xFF, a restart or a fill byte


class Image(WireModel):
    """An image attached to a player's line: encoded (PNG, JPEG) or raw pixels (RGB8, RGBA8: row-major, top row
    first, width x height x 3 or 4 bytes). ``width``/``height`` are required for raw pixels; for PNG/JPEG they
    are optional and, when given, must match the file's header."""

    format: ImageFormat = Field(description="png, jpeg, rgb8 or rgba8")
    data: bytes = Field(min_length=1, description="the file's bytes, or the raw pixels")
    width: int | None = Field(default=None, ge=1, le=2**31 - 1, description="pixels; required for raw")
    height: int | None = Field(default=None, ge=1, le=2**31 - 1, description="pixels; required for raw")

    @classmethod
    def png(cls, data: bytes) -> Image:
        """A PNG file's bytes."""
        return cls(format="png", data=data)

    @classmethod
    def jpeg(cls, data: bytes) -> Image:
        """A JPEG file's bytes."""
        return cls(format="jpeg", data=data)

    @classmethod
    def rgb8(cls, pixels: bytes, width: int, height: int) -> Image:
        """Raw RGB pixels, 3 bytes each, row-major, top row first."""
        return cls(format="rgb8", data=pixels, width=width, height=height)

    @classmethod
    def rgba8(cls, pixels: bytes, width: int, height: int) -> Image:
        """Raw RGBA pixels, 4 bytes each (alpha ignored), row-major, top row first."""
        return cls(format="rgba8", data=pixels, width=width, height=height)

    @classmethod
    def encoded(cls, data: bytes) -> Image:
        """PNG or JPEG bytes, the format told by the file's signature.

        Raises:
            ImageRejected: neither a PNG nor a JPEG signature.
        """
        if data[:8] == _PNG_SIGNATURE:
            return cls.png(data)
        if data[:2] == b"\xff\xd8":
            return cls.jpeg(data)
        raise ImageRejected("neither a PNG nor a JPEG (unknown signature)")


class ImageRejected(ValueError):
    """An image the daemon refuses before decoding. ``limit`` names a size limit (the error is then
    ``too_large``); otherwise the bytes are not what the format says (``invalid_image``)."""

    def __init__(self, message: str, *, limit: str | None = None) -> None:
        super().__init__(message)
        self.limit = limit


@dataclass(frozen=True)
class PngHeader:
    """A PNG's ``IHDR``: size, bit depth, colour type, interlace method (0 none, 1 Adam7)."""

    width: int
    height: int
    depth: int
    colour: int
    interlace: int

    @property
    def bits_per_pixel(self) -> int:
        return _PNG_SAMPLES[self.colour] * self.depth

    @property
    def decoded_bytes(self) -> int:
        """The samples of every row, without filter bytes: what the decoder's pixels take."""
        return self.height * ((self.width * self.bits_per_pixel + 7) // 8)

    @property
    def stream_bytes(self) -> int:
        """What the ``IDAT`` stream inflates to: every row's filter byte and samples, per Adam7 pass when
        interlaced (a pass without pixels has no rows)."""
        if self.interlace == 0:
            return self.height * (1 + (self.width * self.bits_per_pixel + 7) // 8)
        total = 0
        for x0, y0, dx, dy in _ADAM7:
            w = (self.width - x0 + dx - 1) // dx
            h = (self.height - y0 + dy - 1) // dy
            if w > 0 and h > 0:
                total += h * (1 + (w * self.bits_per_pixel + 7) // 8)
        return total


@dataclass(frozen=True)
class JpegFrame:
    """A JPEG's frame header: size, components, and whether it is progressive (else sequential)."""

    width: int
    height: int
    components: int
    progressive: bool

    @property
    def decoded_bytes(self) -> int:
        return self.width * self.height * self.components


def png_header(data: bytes) -> PngHeader:
    """The ``IHDR`` of a PNG, its colour type and bit depth checked.

    Raises:
        ImageRejected: not a PNG, no ``IHDR`` first, or a header the format does not define.
    """
    if data[:8] != _PNG_SIGNATURE:
        raise ImageRejected("the data is not a PNG (no PNG signature)")
    if len(data) < 33 or data[12:16] != b"IHDR" or data[8:12] != b"\x00\x00\x00\x0d":
        raise ImageRejected("the PNG has no IHDR chunk first (truncated or corrupt)")
    width, height, depth, colour, compression, filtering, interlace = struct.unpack(">IIBBBBB", data[16:29])
    if depth not in _PNG_DEPTHS.get(colour, ()):
        raise ImageRejected(f"the PNG's colour type {colour} with bit depth {depth} is not a PNG image type")
    if compression != 0 or filtering != 0 or interlace > 1:
        raise ImageRejected(
            f"the PNG's compression, filter or interlace method ({compression}, {filtering}, {interlace}) is unknown"
        )
    return PngHeader(width, height, depth, colour, interlace)


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk.

    Raises:
        ImageRejected: as ``png_header``.
    """
    header = png_header(data)
    return header.width, header.height


def check_png_stream(data: bytes, header: PngHeader, *, max_chunks: int = MAX_IMAGE_CHUNKS) -> None:
    """The chunks of a PNG whole up to ``IEND``, and its ``IDAT`` stream inflating to exactly
    ``header.stream_bytes``; the inflate holds at most ``INFLATE_STEP_BYTES`` of output at a time and stops as soon
    as the stream runs past the declared size.

    Raises:
        ImageRejected: ``limit="max_image_chunks"`` past ``max_chunks`` chunks; without a limit for a truncated
            file, an unknown critical chunk, a palette image without ``PLTE``, or a stream that is not zlib or
            inflates to other than the declared size.
    """
    want = header.stream_bytes
    inflater = zlib.decompressobj()
    got = 0
    seen_idat = seen_plte = False
    view = memoryview(data)
    pos, chunks = 8, 0
    try:
        while True:
            if pos + 12 > len(data):
                raise ImageRejected("the PNG ends before its IEND chunk (truncated)")
            length = int.from_bytes(data[pos : pos + 4], "big")
            kind = data[pos + 4 : pos + 8]
            end = pos + 12 + length
            if length > 0x7FFFFFFF or end > len(data):
                raise ImageRejected(f"the PNG's {kind!r} chunk at byte {pos} runs past the end of the data")
            chunks += 1
            if chunks > max_chunks:
                raise ImageRejected(f"the PNG has more than {max_chunks} chunks", limit="max_image_chunks")
            if kind == b"IDAT":
                if header.colour == 3 and not seen_plte:
                    raise ImageRejected("the palette PNG has no PLTE chunk before its image data")
                seen_idat = True
                got = _inflate(inflater, view[pos + 8 : end - 4], got, want)
            elif kind == b"IEND":
                break
            elif kind == b"PLTE":
                seen_plte = True
            elif kind == b"IHDR" and pos != 8:
                raise ImageRejected("the PNG has a second IHDR chunk")
            elif not kind.isalpha():
                raise ImageRejected(f"the PNG's chunk at byte {pos} has no chunk type ({kind!r})")
            elif not kind[0] & 0x20 and kind != b"IHDR":  # critical (upper-case first letter), not one of the four
                raise ImageRejected(f"the PNG has a critical chunk {kind!r} the decoder does not know")
            pos = end
    except zlib.error as exc:
        raise ImageRejected(f"the PNG's image data is not a zlib stream ({exc})") from None
    if not seen_idat:
        raise ImageRejected("the PNG has no IDAT chunk")
    if not inflater.eof or got != want:
        raise ImageRejected(
            f"the PNG's image data inflates to {got} bytes{'' if inflater.eof else ' and is cut short'}, not the "
            f"{want} its {header.width}x{header.height} header declares"
        )


def _inflate(inflater: zlib._Decompress, piece: memoryview, got: int, want: int) -> int:
    """Feed ``piece`` to ``inflater``, dropping the output; the bytes inflated so far, never more than ``want + 1``.

    Raises:
        ImageRejected: the stream inflates past ``want``.
        zlib.error: not a zlib stream.
    """
    rest: bytes | memoryview = piece
    while not inflater.eof:
        step = min(INFLATE_STEP_BYTES, want - got + 1)
        out = inflater.decompress(rest, step)
        got += len(out)
        if got > want:
            raise ImageRejected(f"the PNG's image data inflates to more than the {want} bytes its header declares")
        rest = inflater.unconsumed_tail
        if not rest and len(out) < step:  # input used up and no output held back
            break
    return got


def jpeg_frame(data: bytes) -> JpegFrame:
    """A JPEG's first frame header, checked to be one the decoder reads.

    Raises:
        ImageRejected: not a JPEG, no frame header before the data ends or a scan starts, or a frame header the
            decoder does not read.
    """
    return _JpegReader(data, MAX_IMAGE_CHUNKS).frame()


def jpeg_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a JPEG's first start-of-frame marker.

    Raises:
        ImageRejected: as ``jpeg_frame``.
    """
    frame = jpeg_frame(data)
    return frame.width, frame.height


class _JpegReader:
    """The marker segments of a JPEG, in order, from its SOI: after a scan's header, the scan's entropy-coded data is
    searched for the next marker (a stuffed 0xFF, a restart marker or a fill byte is none), not decoded. At most
    ``max_chunks`` segments are read."""

    def __init__(self, data: bytes, max_chunks: int) -> None:
        if data[:2] != b"\xff\xd8":
            raise ImageRejected("the data is not a JPEG (no SOI marker)")
        self._data = data
        self._pos = 2
        self._left = max_chunks - 1
        self._in_scan = False

    def frame(self) -> JpegFrame:
        """The first frame header (see ``jpeg_frame``); the reader stands after it."""
        while (segment := self.next()) is not None:
            marker, start, end = segment
            if marker in _JPEG_SOF:
                return _jpeg_sof(marker, self._data[start:end])
            if marker in (0xDA, 0xD9):  # a scan or the end before any frame header
                break
        raise ImageRejected("the JPEG has no frame header (truncated or corrupt)")

    def check_scans(self, frame: JpegFrame, max_scans: int) -> None:
        """The segments after the frame header: whole, no second frame header, and scans that code the frame the way
        its process does: a sequential JPEG codes each component in one scan (at most ``frame.components`` of
        them), a progressive one in at most ``max_scans``. A file that ends inside a scan's data ends there (the
        decoder reads it so).

        Raises:
            ImageRejected: ``limit="max_image_scans"`` past ``max_scans`` progressive scans; without a limit for a
                truncated segment, a second frame header, a malformed scan header, a sequential JPEG with more
                component scans than components, or no scan.
        """
        scans = coded = 0
        while (segment := self.next()) is not None:
            marker, start, end = segment
            if marker in _JPEG_SOF:
                raise ImageRejected("the JPEG has a second frame header")
            if marker == 0xD9:
                break
            if marker != 0xDA:
                continue
            n = self._data[start] if end > start else 0
            if not 1 <= n <= frame.components or end - start != 4 + 2 * n:
                raise ImageRejected(f"the JPEG's scan header at byte {start - 4} is malformed")
            scans += 1
            coded += n
            if frame.progressive and scans > max_scans:
                raise ImageRejected(f"the progressive JPEG has more than {max_scans} scans", limit="max_image_scans")
            if not frame.progressive and coded > frame.components:
                raise ImageRejected(
                    f"the sequential JPEG codes its {frame.components} components in more scans than one each"
                )
        if scans == 0:
            raise ImageRejected("the JPEG has no scan (truncated or corrupt)")

    def next(self) -> tuple[int, int, int] | None:
        """The next segment: (marker, payload start, payload end); None at the end of the data.

        Raises:
            ImageRejected: bytes where a marker should be, a truncated segment; ``limit="max_image_chunks"`` past
                the segments allowed.
        """
        data, i = self._data, self._pos
        if self._in_scan:
            self._in_scan = False
            found = _JPEG_MARKER_IN_SCAN.search(data, i)
            if found is None:
                return None
            i = found.start()
        while i + 1 < len(data) and data[i] == 0xFF and data[i + 1] == 0xFF:  # fill bytes
            i += 1
        if i + 2 > len(data):
            return None
        if data[i] != 0xFF:
            raise ImageRejected(f"the JPEG is corrupt (no marker at byte {i})")
        self._left -= 1
        if self._left < 0:
            raise ImageRejected("the JPEG has more marker segments than allowed", limit="max_image_chunks")
        marker = data[i + 1]
        if marker in _JPEG_NO_LENGTH or marker in (0xD8, 0xD9):
            self._pos = i + 2
            return marker, i + 2, i + 2
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        end = i + 2 + length
        if i + 4 > len(data) or end > len(data):
            raise ImageRejected(f"the JPEG ends inside the segment at byte {i} (truncated)")
        if length < 2:
            raise ImageRejected("the JPEG is corrupt (a segment shorter than its length field)")
        self._pos = end
        self._in_scan = marker == 0xDA
        return marker, i + 4, end


def _jpeg_sof(marker: int, payload: bytes) -> JpegFrame:
    """The frame header's size and components, checked to be a frame the decoder reads."""
    if marker not in _JPEG_SOF_DECODED:
        raise ImageRejected(
            f"the JPEG's frame (marker 0x{marker:02X}) is lossless, hierarchical or arithmetic-coded: only "
            "baseline, extended and progressive Huffman JPEGs decode"
        )
    if len(payload) < 6:
        raise ImageRejected("the JPEG's frame header is too short")
    precision, height, width, components = struct.unpack(">BHHB", payload[:6])
    if precision != 8:
        raise ImageRejected(f"the JPEG has {precision}-bit samples: only 8-bit JPEGs decode")
    if components not in (1, 3, 4):
        raise ImageRejected(f"the JPEG has {components} components: only 1, 3 or 4 decode")
    if len(payload) != 6 + 3 * components:
        raise ImageRejected("the JPEG's frame header length does not match its components")
    for c in range(components):
        sampling = payload[6 + 3 * c + 1]
        if not (1 <= sampling >> 4 <= 4 and 1 <= sampling & 15 <= 4):
            raise ImageRejected(f"the JPEG's component {c} has sampling factors outside 1 to 4")
    return JpegFrame(width, height, components, marker == 0xC2)


def check_image(
    image: Image,
    *,
    max_side_px: int = MAX_IMAGE_SIDE_PX,
    max_pixels: int = MAX_IMAGE_PIXELS,
    max_decoded_bytes: int = MAX_IMAGE_DECODED_BYTES,
    max_chunks: int = MAX_IMAGE_CHUNKS,
    max_scans: int = MAX_IMAGE_SCANS,
) -> tuple[int, int]:
    """The image's (width, height), after checking that its bytes are what its format says, that its declared size
    is within the limits, and that decoding it costs no more than that size (see the module docstring). The sizes
    are checked from the header before the rest of the file is read.

    Raises:
        ImageRejected: with ``limit`` set (``"max_image_side_px"``, ``"max_image_pixels"``,
            ``"max_image_decoded_bytes"``, ``"max_image_chunks"``, ``"max_image_scans"``) for an image too large,
            without for bytes that are not a valid image of the format (or sizes that disagree).
    """
    png: PngHeader | None = None
    jpeg: _JpegReader | None = None
    if image.format in _CHANNELS:
        if image.width is None or image.height is None:
            raise ImageRejected(f"a {image.format} image needs width and height")
        width, height = image.width, image.height
        decoded = width * height * _CHANNELS[image.format]
        if len(image.data) != decoded:
            raise ImageRejected(
                f"{image.format} data of {len(image.data)} bytes is not {width}x{height}x"
                f"{_CHANNELS[image.format]} = {decoded} bytes"
            )
    else:
        if image.format == "png":
            png = png_header(image.data)
            width, height, decoded = png.width, png.height, png.decoded_bytes
        else:
            jpeg = _JpegReader(image.data, max_chunks)
            frame = jpeg.frame()
            width, height, decoded = frame.width, frame.height, frame.decoded_bytes
        if image.width is not None and image.width != width or image.height is not None and image.height != height:
            raise ImageRejected(
                f"width/height {image.width}x{image.height} disagree with the {image.format} header ({width}x{height})"
            )
    if width < 1 or height < 1:
        raise ImageRejected(f"a {width}x{height} image is empty")
    if max(width, height) > max_side_px:
        raise ImageRejected(f"a {width}x{height} image exceeds {max_side_px} px per side", limit="max_image_side_px")
    if width * height > max_pixels:
        raise ImageRejected(f"a {width}x{height} image exceeds {max_pixels} pixels", limit="max_image_pixels")
    if decoded > max_decoded_bytes:
        raise ImageRejected(
            f"a {width}x{height} {image.format} image decodes to {decoded} bytes, more than {max_decoded_bytes}",
            limit="max_image_decoded_bytes",
        )
    if png is not None:
        check_png_stream(image.data, png, max_chunks=max_chunks)
    elif jpeg is not None:
        jpeg.check_scans(frame, max_scans)
    return width, height
