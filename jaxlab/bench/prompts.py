"""The prompts of every measurement: equal-length windows of one fixed English text, one per row."""

from __future__ import annotations

from typing import Sequence

#: A fixed English text; prompts are windows of its tokens (different per row, all the same length).
TEXT = """\
The history of the lighthouse is, in a quiet way, the history of trade. Long before anyone printed a
chart, sailors watched for fires kept burning on headlands, and a town that wanted ships to call made
sure its fire was the brightest on the coast. The famous tower at Alexandria was built of pale stone
and rose higher than any building its visitors had seen; travellers wrote that its light could be
seen from a day's sailing away, which was surely an exaggeration, but a useful one for the merchants
who paid for the fuel.

For most of the following centuries the technology hardly changed. A keeper climbed the stairs at
dusk, trimmed the wicks, polished the glass and sat through the night listening to the wind. Coal
gave way to oil, and oil to gas, but the light itself stayed weak until a French engineer, Augustin
Fresnel, worked out how to bend it. His lens, a set of glass rings arranged like the steps of a
shallow staircase, gathered the glow of a single flame into a beam that carried twenty miles. Within
a few decades nearly every important light in the world had one.

Keeping a light was lonely work, and the records kept by keepers are full of small details: the day
the supply boat was late, the number of birds that struck the lantern in autumn fog, the price of
flour, a child born on the rock. Some stations were so exposed that the keepers were relieved only
when the sea allowed, and a storm could stretch a four-week turn into three months. Others stood at
the end of a village street, and the keeper's garden was famous for its roses.

Electric lamps, automatic switches and, later, satellite navigation made the keepers unnecessary.
The last of them left their towers within living memory. Many of the buildings are now museums or
holiday cottages, and a few still shine every night, unattended, because a small boat on a dark sea
trusts a light it can see more than a number on a screen.

A good loaf of bread needs only four things: flour, water, salt and time. The flour gives the
structure, because the proteins in wheat form long elastic chains when they are wet and worked. The
water wakes the yeast and lets the starch swell. Salt tightens the dough and seasons it; without salt
bread tastes flat however well it has risen. Time is the ingredient most recipes underestimate. A
dough left to ferment slowly in a cool kitchen develops a deeper flavour and a more open crumb than
one hurried along in a warm oven, and it is easier to shape.

Bakers talk about the windowpane test: stretch a small piece of dough between your fingers, and if
it becomes thin enough to let light through without tearing, the gluten is ready. Then the dough is
folded, rested, divided and shaped. A tight surface holds the gas in and gives the loaf its height.
A sharp cut across the top, made just before baking, lets the crust open where the baker chooses
instead of splitting at random. Steam in the first minutes of baking keeps the surface soft long
enough for the loaf to expand, and then the crust sets, browns and begins to sing as it cools.

Rivers shape the land more patiently than any engineer. A stream that carries a little sand every
day will, over thousands of years, cut a valley through solid rock. Where the slope eases, the water
slows and drops what it carried, building bars, islands and wide flat plains that flood in spring
and feed the fields that grow along them. People have always settled beside rivers for their water,
their fish and their soil, and then spent centuries trying to stop them from moving.

The weather forecast on the evening news is the result of an enormous calculation. The atmosphere
is divided into millions of boxes, and for each one a computer estimates how the temperature,
pressure, humidity and wind will change over the next few minutes, using the laws of physics and
the measurements of thousands of stations, balloons, ships and satellites. Then it repeats the step,
again and again, until it has reached next week. Small errors grow as the calculation runs, which
is why a forecast for tomorrow is usually right and a forecast for ten days ahead is a rough guide.

Learning a musical instrument teaches patience in a way few other things do. The first weeks are
full of noise: strings that buzz, notes that crack, fingers that will not go where they are told.
Progress is slow and uneven, and it often seems to happen overnight, after a week of practice in
which nothing improved. Teachers say that ten minutes every day is worth more than two hours once a
week, because the hands learn by repetition and the memory of a movement fades quickly. The reward
comes gradually, on the evening when a piece that was impossible a month ago is simply played.
"""


def make_prompts(ids: Sequence[int], rows: int, length: int) -> list[list[int]]:
    """``rows`` windows of ``length`` tokens from ``ids`` at evenly spaced starts (distinct rows as long
    as the text allows); the text is repeated when it is too short."""
    ids = list(ids)
    if not ids:
        raise ValueError("no token ids to take prompts from")
    need = length + max(rows - 1, 0)
    while len(ids) < need:
        ids = ids + ids
    stride = (len(ids) - length) // max(rows - 1, 1)
    return [ids[r * stride : r * stride + length] for r in range(rows)]
