"""A process's position among its instructions (workers.progress), in the training process, in milliseconds.

The configurations where workers play (fork, spawn, persistent, StatefulDataLoader) are the resume harness's
and tests/runtime/test_worker_control.py's; these pin the rules they rely on.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardio.errors import StateError
from shardio.planning.plan import Segment
from shardio.runtime.control import Control, Instruction
from shardio.runtime.progress import Progress, resume_point
from shardio.state import LoaderState
from shardio.world import Context

HERE = Context()  # the training process, iterating itself


def state(**fields: object) -> LoaderState:
    values: dict[str, object] = dict(epoch=2, seed=0, index="i", options={"batch_size": 3}, world_size=4)
    values.update(fields)
    return LoaderState(**values)  # type: ignore[arg-type]


def test_a_state_of_the_same_world_resumes_at_its_position() -> None:
    loaded, instruction, skip, ahead = resume_point(
        [state(start=3, yielded=4)], 0, world_size=4, context=HERE
    )
    assert instruction == Instruction(2, (), 7, loaded=True)
    assert (loaded.position, skip, ahead) == (7, 0, ())


def test_the_workers_states_and_the_steps_since_their_snapshot_add_up() -> None:
    workers = [state(yielded=3, worker=0, num_workers=2), state(yielded=2, worker=1, num_workers=2)]
    _, instruction, _, _ = resume_point(workers, 1, world_size=4, context=HERE)
    assert instruction.start == 6


def test_another_world_size_records_a_history_segment_and_starts_the_rest() -> None:
    _, instruction, skip, _ = resume_point(
        [state(start=5, history=(Segment(8, 2),))], 0, world_size=3, context=HERE
    )
    assert instruction == Instruction(2, (Segment(8, 2), Segment(4, 5)), 0, loaded=True)
    assert skip == 0


def test_batches_consumed_ahead_of_the_position_start_a_segment_in_the_same_world() -> None:
    # worker 0 took positions 0, 2, 4 and 6; worker 1 took 1: consumed are 0-2, then 4 and 6 ahead
    workers = [state(yielded=4, worker=0, num_workers=2), state(yielded=1, worker=1, num_workers=2)]
    loaded, instruction, _, ahead = resume_point(workers, 0, world_size=4, context=HERE)
    assert (loaded.position, ahead) == (3, (4, 6))
    assert instruction == Instruction(2, (Segment(4, 3),), 0, loaded=True)


def test_a_single_workers_state_outside_that_worker_is_not_the_jobs() -> None:
    with pytest.raises(StateError, match="1 states for 2 workers"):
        resume_point([state(yielded=3, worker=1, num_workers=2)], 0, world_size=4, context=HERE)


def test_an_iteration_is_live_until_it_finishes_then_the_next_epoch_is() -> None:
    progress = Progress()
    progress.control.give(Instruction(4, start=2, loaded=True))
    assert progress.upcoming(HERE) == Instruction(4, start=2, loaded=True)
    assert progress.current(HERE) == (Instruction(4, start=2, loaded=True), 0)
    at = progress.upcoming(HERE)
    progress.begin(at, progress.upcoming_skip(), HERE)
    progress.yielded += 3
    assert progress.current(HERE) == (at, 3)
    assert progress.live(HERE) == at
    progress.finish(HERE)
    assert progress.live(HERE) == Instruction(5)
    assert progress.current(HERE) == (at, 3)  # the last iteration, until an instruction comes


def test_an_instruction_given_after_an_iteration_replaces_it() -> None:
    progress = Progress()
    progress.begin(progress.upcoming(HERE), 0, HERE)
    progress.yielded += 1
    instructions = progress.instructions
    progress.control.give(Instruction(7))
    assert progress.instructions == instructions + 1
    assert progress.current(HERE) == (Instruction(7), 0)
    assert progress.live(HERE) == Instruction(7)


def test_a_workers_own_instruction_wins_over_the_control_blocks() -> None:
    progress = Progress()
    progress.give_own(Instruction(3, start=1), skip=2)
    assert not progress.follows_control
    assert (progress.upcoming(HERE), progress.upcoming_skip()) == (Instruction(3, start=1), 2)
    progress.begin(progress.upcoming(HERE), progress.upcoming_skip(), HERE)
    assert progress.follows_control
    assert progress.yielded == 2


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_every_process_of_an_iteration_plays_the_next_epoch(data: st.DataObject) -> None:
    """Iterations without set_epoch, simulated on a control block: the training process itself (slot 0) or
    the workers of one DataLoader iterator (any count, seeds fresh or the same as before, persistent or not),
    their first looks and begins interleaved. Every process of an iteration plays the same epoch, the one
    after the last iteration's (the instruction's first)."""
    control = Control()
    given_epoch = data.draw(st.integers(0, 3))
    first = Instruction(given_epoch, start=data.draw(st.integers(0, 2)), loaded=True)
    control.give(first)
    trained = 0  # iterations the training process has begun itself (forked workers inherit the count)
    persistent: dict[int, list[int]] = {}  # worker count -> each persistent worker's iterations begun
    for number in range(data.draw(st.integers(1, 6))):
        workers = data.draw(st.integers(0, 4))
        if workers == 0:
            played = [control.upcoming(0)]
            control.begin(0, played[0].epoch)
            trained += 1
        else:
            keep = data.draw(st.booleans())  # a persistent loader: its workers, their seed and counts, stay
            seed = (
                1000 + workers if keep else data.draw(st.sampled_from([7, 7 + number * 100]))
            )  # 7: the same again
            counts = persistent.setdefault(workers, [trained] * workers) if keep else [trained] * workers
            names = [hash((seed, workers, counts[w])) & (2**55 - 1) | 1 for w in range(workers)]
            order = data.draw(
                st.permutations(
                    [("look", w) for w in range(workers)] + [("begin", w) for w in range(workers)]
                )
            )
            looked: dict[int, Instruction] = {}
            for step, w in order:  # a worker's first event looks (a begin drawn first looks, then begins)
                if w not in looked:
                    looked[w] = control.upcoming(1 + w, names[w])
                if step == "begin":
                    control.begin(1 + w, looked[w].epoch, names[w])
                    counts[w] += 1
            played = list(looked.values())
        expected = first if number == 0 else Instruction(given_epoch + number)
        assert played == [expected] * len(played)
