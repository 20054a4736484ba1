#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets: tests/fuzz/corpus/<target>/<name>, a few dozen small files each.

The byte layout is fuzz_input.h's: byte 0 the case, 8 configuration bytes, then edits of 11 bytes (target, kind,
arg, 8 value bytes little endian). A seed is a starting point, so its meaning only has to be roughly right: if the
tables of the targets change, these files still make valid inputs. Seeds named regression-* reproduce a finding that
was fixed (docs/reliability.md lists them); the targets must pass them.

usage: python3 tests/fuzz/make_corpus.py [--out DIR]   (default: the corpus/ folder beside this script)
"""
import argparse
import os
import shutil
import struct

# Edit.int64's table (fuzz_input.cpp), by name, for arg % 4 == 0.
BOUNDARY = {"0": 0, "-1": 2, "int32_max": 14, "2^32": 17, "2^61": 21, "2^62": 22, "int64_max-1": 25,
            "int64_max": 26, "int64_min": 27}
# Edit.real's table (fuzz_input.cpp), for an even arg.
REAL = {"0": 0, "nan": 6, "inf": 7, "-inf": 8, "max": 9, "denorm": 11}


def edit(target, kind=0, arg=0, raw=0):
    return bytes([target & 0xFF, kind & 0xFF, arg & 0xFF]) + struct.pack("<Q", raw & (2**64 - 1))


def boundary(target, kind, name, dim=0):
    """An edit whose int64 value is BOUNDARY[name]; dim goes to arg bits 2-3 (the view edits' dimension)."""
    return edit(target, kind, dim << 2, BOUNDARY[name])


def case(index, config=(), *edits):
    cfg = bytes(config) + bytes(8 - len(config))
    return bytes([index]) + cfg + b"".join(edits)


# ---- plan_create: the descriptor kinds and their field counts (fuzz_plan_create.cpp's fields_of) -------------
KINDS = [("handle", 5), ("router", 10), ("dispatch", 6), ("gemm", 15), ("combine", 6), ("bias_grad", 7),
         ("group_select", 10), ("sparse_ffn", 10), ("moe", 21), ("experts", 21)]


def plan_create_seeds():
    seeds = {}
    for k, (name, fields) in enumerate(KINDS):
        seeds[f"{name}"] = case(k)
        seeds[f"{name}-struct-size-0"] = case(k, (), edit(0, 0, 3, 0))
        seeds[f"{name}-null-desc"] = case(k, (), edit(fields + 0))
        seeds[f"{name}-null-output"] = case(k, (), edit(fields + 1))
        seeds[f"{name}-huge"] = case(k, (), boundary(1, 0, "int64_max"), boundary(2, 0, "2^62"),
                                     boundary(fields - 1, 0, "int64_min"))
    # Fields of the MoE descriptor: 3 intermediate, 4 router_experts; experts (kind 9) shares them.
    seeds["regression-moe-h-width-overflow"] = case(8, (), boundary(3, 0, "2^62"))
    seeds["regression-moe-logits-overflow"] = case(8, (), boundary(4, 0, "int64_max-1"))
    seeds["regression-experts-h-overflow"] = case(9, (), boundary(3, 0, "2^61"))
    # The configuration block's first 4 bytes are the status moekit_status_string names: -1, no status of moekit.h.
    seeds["regression-status-string-unknown"] = case(0, (0xFF, 0xFF, 0xFF, 0xFF))
    return seeds


# ---- tensor_views and run_calls: the run calls (fuzz_ops.h's Op) and their slot and scalar counts -------------
OPS = [("router_forward", 7, 0), ("router_backward", 6, 1), ("dispatch", 6, 0), ("gemm", 11, 2), ("combine", 5, 1),
       ("broadcast_backward", 5, 1), ("db1", 3, 1), ("db2_ds", 8, 1), ("group_select", 6, 0),
       ("load_balance_update", 3, 5), ("moe_forward", 13, 1), ("moe_backward", 14, 8), ("experts_forward", 7, 0),
       ("experts_backward", 10, 7), ("sparse_ffn_forward", 9, 1), ("sparse_ffn_backward", 9, 6),
       ("subsample_rows", 1, 4)]
SPECIALS = 4  # plan, args, workspace, saved (fuzz_call.cpp)
VALIDATE = 0x80  # byte 0 bit 7: the call is also made on a handle with MOEKIT_HANDLE_VALIDATE (fuzz_ops.h)
# View edit kinds (fuzz_call.cpp State::view_edit).
PRESENCE, NULL_DATA, DTYPE, RANK, SHAPE, STRIDE, PAD, DEVICE, RESERVED, MISALIGN, ALIAS, MAKE, SWAP, TRANSPOSE, \
    UNIT_STRIDE, OVERLAP = range(16)
# Value edit kinds (State::value_edit).
RAW, BOUNDARY_VALUES, ELEMENT, TOGGLE, SHARE, RESEED = range(6)
# Configurations (fuzz_ops.h): byte 0 dtype / index dtype / scores, 1 T, 2 E, 3 K, 4 H, 5 I, 6 and 7 variants.
CONFIGS = {"t0": (0, 1), "fp64-int64": (0x0F, 0, 3, 3), "fp16-wide": (1, 9, 6, 4, 24, 12),
           "variant-a": (0, 0, 0, 0, 0, 0, 0x5B, 0x6D)}


def view_seeds():
    seeds = {}
    for op, (name, slots, scalars) in enumerate(OPS):
        seeds[f"{name}"] = case(op, CONFIGS["t0"], edit(0, PAD, 0, 1), edit(slots - 1, UNIT_STRIDE, 0, 7))
        seeds[f"{name}-views"] = case(op, CONFIGS["variant-a"], edit(0, DTYPE, 0, 3), edit(slots - 1, OVERLAP, 0, 0),
                                      boundary(slots // 2, SHAPE, "int64_min", 1), boundary(1 % slots, RANK, "-1"),
                                      edit(0, MAKE, 0x10, 5), edit(slots - 1, SWAP, 0, 1))
        seeds[f"{name}-memory"] = case(op, CONFIGS["fp16-wide"], edit(0, MISALIGN, 0, 1), edit(1 % slots, ALIAS, 0, 0),
                                       edit(slots - 1, DEVICE, 0, 2), edit(0, RESERVED, 1, 9),
                                       edit(slots + 0, 0), edit(slots + 1, 1, 3, 8), edit(slots + 3, 3, 0, 5))
        seeds[f"{name}-validate"] = case(op | VALIDATE, (), edit(0, PAD, 0, 1), edit(slots - 1, UNIT_STRIDE, 0, 7))
    # A stride of INT64_MAX on dimension 0 of a tensor of 5 or 10 rows: strides reaching past 2^63 bytes.
    for op, slot in ((0, 0), (3, 2), (4, 2), (10, 0)):
        seeds[f"regression-{OPS[op][0]}-stride-past-2^63"] = case(op, (), boundary(slot, STRIDE, "int64_max", 0))
    seeds["regression-router_forward-stride-2^61"] = case(0, (), boundary(0, STRIDE, "2^61", 0))
    # General dispatch (variant bit 0): tok_offsets [T+1] with shape[0] = INT64_MIN, T = shape[0] - 1 wrapped.
    seeds["regression-dispatch-tok-offsets-int64-min"] = case(2, (0, 0, 0, 0, 0, 0, 1), boundary(0, SHAPE, "int64_min"))
    # db2 + ds without b2, so without dscores: P = 10 grouped rows.
    seeds["regression-db2_ds-without-dscores"] = case(7)
    # db2 + ds with b2 (byte 6 bit 2), b2's data dropped, then dscores: a valid call without b2 or dscores.
    seeds["regression-db2_ds-b2-data-dropped"] = case(7, (0, 0, 0, 0, 0, 0, 0x04), edit(2, NULL_DATA),
                                                      edit(7, PRESENCE))
    # moekit_tensor_make (rank 2 from the table) of dtype 2^30, no dtype of moekit.h, and of shape [5, 2^62 + 1].
    seeds["regression-tensor-make-unknown-dtype"] = case(0, (), edit(0, DTYPE, 0, 11), edit(0, MAKE, 0x10, 3))
    seeds["regression-tensor-make-stride-overflow"] = case(0, (), edit(0, SHAPE, 1 << 2, 23), edit(0, MAKE, 0x10, 3))
    return seeds


def value_seeds():
    seeds = {}
    for op, (name, slots, scalars) in enumerate(OPS):
        seeds[f"{name}"] = case(op, CONFIGS["t0"])
        seeds[f"{name}-values"] = case(op, CONFIGS["variant-a"], edit(0, BOUNDARY_VALUES, 0, 0),
                                       edit(slots - 1, ELEMENT, 1, 0x7FF8000000000001), edit(1 % slots, RAW, 0, 0))
        extra = [edit(slots + SPECIALS + s, 0, s, 3) for s in range(scalars)]
        seeds[f"{name}-scalars-buffers"] = case(op, CONFIGS["fp64-int64"], edit(slots + 2, 1, 0, 7),
                                                edit(slots + 3, 1, 3, 0), *extra)
        seeds[f"{name}-validate"] = case(op | VALIDATE)
        seeds[f"{name}-validate-values"] = case(op | VALIDATE, (), edit(0, ELEMENT, 0, REAL["nan"]),
                                                edit(1 % slots, BOUNDARY_VALUES, 0, 0))
    for op in (11, 13, 15):
        name = OPS[op][0]
        seeds[f"{name}-saved-header"] = case(op, (), edit(OPS[op][1] + 3, 3, 1, 9))
        seeds[f"{name}-saved-null"] = case(op, (), edit(OPS[op][1] + 3, 0))
    # Dispatch with int64 ids (byte 0 bit 2) and expert_begin = 1 (byte 7): boundary ids include INT64_MIN.
    seeds["regression-dispatch-int64-min-id"] = case(2, (4, 0, 0, 0, 0, 0, 0, 1), edit(0, BOUNDARY_VALUES, 0, 1))
    # subsample_rows with num_groups = INT64_MAX - 1 (its second scalar): num_groups * group_size wrapped.
    seeds["regression-subsample_rows-num-groups-overflow"] = case(16, (), boundary(1 + SPECIALS + 1, 0, "int64_max-1"))
    # subsample_rows of one group (its second scalar) of 2^31 - 1 neurons (its third): the draw once took 16 GiB.
    seeds["regression-subsample_rows-huge-group"] = case(16, (), edit(1 + SPECIALS + 1, 0, 0, 1),
                                                         boundary(1 + SPECIALS + 2, 0, "int32_max"))
    seeds["regression-db2_ds-without-dscores"] = case(7)
    # Validating, with the aux losses on and their tensors passed (router: byte 7 bits 0-3; MoE: byte 0 bits 4-5):
    # the loss tensors were in no value check, so a NaN upstream gradient ran and an overflowed z-loss passed.
    seeds["regression-router_backward-validate-nan-dz-loss"] = case(1 | VALIDATE, (0, 0, 0, 0, 0, 0, 0, 0x0F),
                                                                    edit(5, ELEMENT, 0, REAL["nan"]))
    seeds["regression-moe_backward-validate-nan-dload-balance-loss"] = case(11 | VALIDATE, (0x30,),
                                                                            edit(12, ELEMENT, 0, REAL["nan"]))
    seeds["regression-router_forward-validate-z-loss-overflow"] = case(0 | VALIDATE, (0, 0, 0, 0, 0, 0, 0, 0x0F),
                                                                       edit(0, ELEMENT, 1, bits(1e30)))
    return seeds


def bits(value):
    """An edit value holding the double's bits (Edit.real with an odd arg)."""
    return struct.unpack("<Q", struct.pack("<d", value))[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus"))
    args = parser.parse_args()
    for target, seeds in (("plan_create", plan_create_seeds()), ("tensor_views", view_seeds()),
                          ("run_calls", value_seeds())):
        folder = os.path.join(args.out, target)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        for name, data in sorted(seeds.items()):
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
        print(f"{folder}: {len(seeds)} seeds")


if __name__ == "__main__":
    main()
