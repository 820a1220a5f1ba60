"""`simulate.bus.KeyedRandom`, a handler's keyed generator seeded on its first draw, draws what
`random.Random(key)` draws."""

from __future__ import annotations

import random

from tpuq_dev.simulate.bus import KeyedRandom


def _draws(rng: random.Random) -> list:
    items = list(range(20))
    rng.shuffle(items)
    return [rng.random(), rng.randrange(10 ** 9), rng.choice("abcdefg"), rng.expovariate(2.0), rng.gauss(0, 1),
            rng.gauss(0, 1), rng.uniform(1, 2), rng.getrandbits(70), rng.sample(range(100), 5), rng.randbytes(5),
            items]


def test_keyed_random_draws_what_a_generator_seeded_with_its_key_draws():
    for i in range(50):
        key = f"7:claimer-ticks:{i}:1"
        assert _draws(KeyedRandom(key)) == _draws(random.Random(key))
        assert KeyedRandom(key).getstate() == random.Random(key).getstate()


def test_keyed_random_seeded_again_forgets_its_key():
    rng = KeyedRandom("a")
    rng.seed(3)
    assert _draws(rng) == _draws(random.Random(3))
