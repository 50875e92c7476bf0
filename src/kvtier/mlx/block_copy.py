"""Copying whole blocks out of and into an MLX array, with MLX's own gather and scatter.

Bytes leave MLX as a zero-copy ``memoryview`` of the gathered blocks and enter it as a new array
scattered into place. Every element type goes through a ``uint8`` view (``mx.view``), so
bfloat16, which NumPy has no type for, moves as its bytes, bit for bit.
"""

import mlx.core as mx
import numpy as np


def gather_blocks(array: mx.array, block_ids: np.ndarray) -> np.ndarray:
    """The bytes of blocks ``block_ids`` of ``array``: ``uint8`` ``[len(block_ids), block]``.

    Precondition: every id is in ``[0, array.shape[0])`` (MLX does not check: an id past the end
    reads other memory). The result is a view of an MLX buffer, which it keeps alive.
    """
    taken = mx.view(mx.take(array, mx.array(block_ids), axis=0), mx.uint8)
    mx.eval(taken)
    return np.frombuffer(memoryview(taken), dtype=np.uint8).reshape(len(block_ids), -1)


def scatter_blocks(array: mx.array, block_ids: np.ndarray, rows: np.ndarray) -> mx.array:
    """``array`` with blocks ``block_ids`` replaced by ``rows`` (``uint8``, one block a row).

    Same precondition on the ids. Returns the array to rebind: MLX updates ``array`` in place
    when nothing else shares its buffer and otherwise into a new one.
    """
    values = mx.view(mx.array(rows), array.dtype).reshape((len(block_ids), *array.shape[1:]))
    array[mx.array(block_ids)] = values
    mx.eval(array)
    return array
