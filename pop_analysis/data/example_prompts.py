"""Example prompts the pages offer and open with (Generate, Drift, Step through) and the stored
examples are made from: short ones, one long (several hundred tokens), one for the step-through
(37 tokens without a chat template: long enough that POP's first token comes visibly earlier,
short enough that a grid column per token still reads)."""

SHORT = "Why is the sky blue? Answer in two sentences."

LONG = """Read the report and answer the question at the end.

The harbour town of Kestrel Bay was founded by fishermen who arrived in three boats. For its first
forty years the town had no road to the interior; everything it needed came by sea, and everything
it sold left the same way. The first road was cut through the hills by the mining company that
opened a copper pit at Greystone, nineteen kilometres inland. The company built the road for its
own wagons, but it allowed the townspeople to use it on Sundays, and within a decade farmers from
the valley were bringing wool, cheese and timber down to the harbour every week of the year.

The copper ran out after twenty-six years. The company left, the pit filled with rain water and
became a lake, and the road fell into disrepair. The town council voted to maintain it with a toll
of two pennies per cart, collected at a wooden booth at the foot of the hills. The toll keeper,
a retired sailor named Amos Reed, kept a ledger of every cart that passed. His ledgers survive:
in the busiest year he recorded 11,412 carts, in the quietest 3,208. When the railway reached the
valley the number of carts fell every year, and the booth closed for good in the spring of the year
the harbour was deepened for steamships.

Today the lake at Greystone is a nature reserve, the toll booth stands in the town museum beside
Reed's ledgers, and the old road is a footpath that walkers take from the harbour to the lake in
about five hours. The town's fishing fleet is smaller than it was, but the deep harbour brings
cruise ships in summer, and the museum is the town's most visited building.

Question: Why was the first road to the interior built, and what later reduced the traffic on it?"""

EXAMPLES = {"short: sky": SHORT, "long: a town's history (~440 tokens)": LONG,
            "short: arithmetic": "A shop sells pens at 3 dollars each. How much do 7 pens cost? "
                                 "Explain step by step."}

STEP = ("The first three planets from the Sun are Mercury, Venus and Earth. Then come Mars, the "
        "giant Jupiter, Saturn with its rings, Uranus and, farthest out, the blue world of")
# 37 tokens on SmolLM2, 38 on Gemma-3 (its BOS); 12-token prompts gain little (the boundary step)
