"""The built-in calibration prompts: written for POP Lab, usable offline.

Six kinds, mixed so that the first n prompts of the set are varied too (calibration takes the first
n): arithmetic word problems, code, writing, factual questions, reasoning, summarising.
"""
from __future__ import annotations

ARITHMETIC = (
    "A baker makes 48 muffins and sells them in boxes of 6. Each box costs $9. How much money does the baker make if every box is sold?",
    "Maria reads 18 pages of a book every evening. The book has 342 pages. How many evenings does she need to finish it?",
    "A train leaves at 9:40 and arrives at 13:15. How long is the journey in minutes?",
    "Tom has three times as many marbles as Ana. Together they have 64 marbles. How many marbles does Tom have?",
    "A garden is 12 meters long and 7 meters wide. Fencing costs $15 per meter. How much does it cost to fence the whole garden?",
    "A shop gives a 20% discount on a jacket that costs $85, then adds 10% sales tax. What is the final price?",
    "A school has 420 students. Two sevenths of them walk to school and the rest take the bus. How many take the bus?",
    "A car uses 6 liters of fuel per 100 km. Fuel costs $1.80 per liter. What does a 350 km trip cost in fuel?",
    "Sam saves $25 every week. He already has $140. After how many weeks will he have at least $500?",
    "A recipe needs 3 eggs for 12 pancakes. How many eggs are needed for 40 pancakes, rounding up to whole eggs?",
    "A water tank holds 1,200 liters and leaks 35 liters per hour. A pump adds 50 liters per hour. Starting empty, how full is it after 24 hours?",
    "Five friends split a restaurant bill of $137.50 equally and each leaves a $3 tip on top. How much does each person pay?",
    "A cyclist rides at 18 km/h for 2.5 hours, then at 12 km/h for 40 minutes. How far does she ride in total?",
    "There are 7 rows of chairs with 14 chairs in each row. 23 chairs are taken. How many chairs are free?",
    "A phone plan costs $12 per month plus $0.05 per text message. In March Lee sent 260 messages. What was the bill?",
    "A farmer has chickens and cows. There are 30 heads and 86 legs. How many cows are there?",
    "A store sells pencils at 4 for $1.20. How much do 26 pencils cost?",
    "A movie is 2 hours and 17 minutes long and starts at 7:50 pm. At what time does it end?",
)

CODE = (
    "Write a Python function that returns True if a string is a palindrome, ignoring spaces and case.",
    "Explain what a hash map is and give a short example of using one in Python.",
    "Write a SQL query that lists the five customers with the highest total order amount from tables customers(id, name) and orders(id, customer_id, amount).",
    "What is the difference between a list and a tuple in Python? When would you use each?",
    "Write a JavaScript function that removes duplicate values from an array while keeping the original order.",
    "Find the bug in this Python code: def average(xs): return sum(xs) / len(xs) - what happens for an empty list and how would you fix it?",
    "Write a function in C that reverses a null-terminated string in place.",
    "Explain recursion to a beginner using the factorial function as an example.",
    "Write a bash one-liner that counts the lines of all .py files in a directory tree.",
    "What does the time complexity O(n log n) mean? Name two algorithms with this complexity.",
    "Write a Python class for a simple stack with push, pop and peek methods.",
    "Explain the difference between git merge and git rebase in a few sentences.",
    "Write a regular expression that matches a date in the format YYYY-MM-DD and explain each part.",
    "Write a Python generator that yields the Fibonacci numbers below a given limit.",
    "What is a race condition? Give a short example with two threads updating a counter.",
    "Convert this loop to a list comprehension: result = []; for x in range(20): if x % 3 == 0: result.append(x * x)",
    "Write a function that checks whether two words are anagrams of each other.",
    "Explain what an HTTP 404 status code and a 500 status code mean.",
)

WRITING = (
    "Write a short poem about the first snow of winter.",
    "Write a polite email to a landlord asking for a leaking kitchen tap to be repaired.",
    "Write the opening paragraph of a mystery story set in a lighthouse.",
    "Write a product description for a reusable water bottle that keeps drinks cold for 24 hours.",
    "Write a thank-you note to a teacher who helped you prepare for an exam.",
    "Write a haiku about a city at night.",
    "Write a short speech for a friend's wedding toast, warm and a little funny.",
    "Write a dialogue between a robot and a child who meet for the first time.",
    "Write a cover letter paragraph for a junior data analyst position.",
    "Describe a busy morning market using all five senses.",
    "Write a limerick about a cat who loves to sleep on keyboards.",
    "Write a short motivational message for someone starting to learn the piano as an adult.",
    "Write a two-paragraph blog post introduction about the benefits of walking every day.",
    "Rewrite this sentence to sound more formal: 'Hey, we can't make the meeting, can we move it to next week?'",
    "Write a fable with a moral about patience, featuring a tortoise and a river.",
    "Write a tweet announcing the opening of a new community library.",
    "Write a short bedtime story about a dragon who is afraid of the dark.",
)

FACTUAL = (
    "What is photosynthesis and why is it important for life on Earth?",
    "Why is the sky blue during the day and red at sunset?",
    "Who wrote the novel 'Pride and Prejudice' and when was it published?",
    "What is the capital of Australia, and why is it not Sydney?",
    "How does a vaccine help the immune system fight a disease?",
    "What causes the seasons on Earth?",
    "What is the difference between weather and climate?",
    "How many planets are in the solar system? List them in order from the Sun.",
    "What is the boiling point of water at sea level in Celsius and Fahrenheit?",
    "Explain how a rainbow forms.",
    "What was the purpose of the Great Wall of China?",
    "What is the largest ocean on Earth and roughly how much of the planet's surface does it cover?",
    "What are the three states of matter, and how do they differ?",
    "What does DNA stand for and what does it do in a cell?",
    "Why do we have leap years?",
    "What is inflation in economics?",
    "How do bees make honey?",
    "What is the speed of light in a vacuum, approximately?",
)

REASONING = (
    "If all bloops are razzies and all razzies are lazzies, are all bloops definitely lazzies? Explain.",
    "A bat and a ball cost $1.10 in total. The bat costs $1.00 more than the ball. How much does the ball cost? Think step by step.",
    "You have two ropes that each take exactly one hour to burn, but burn unevenly. How can you measure 45 minutes?",
    "Which is heavier: a kilogram of feathers or a kilogram of iron? Explain your answer.",
    "If it takes 5 machines 5 minutes to make 5 widgets, how long would it take 100 machines to make 100 widgets?",
    "Anna is taller than Ben. Ben is taller than Carla. Is Carla taller than Anna? Explain.",
    "What comes next in the sequence 2, 6, 12, 20, 30, ...? Explain the pattern.",
    "A man looks at a photo and says: 'Brothers and sisters I have none, but that man's father is my father's son.' Who is in the photo?",
    "You are in a race and you overtake the person in second place. What position are you in now?",
    "If today is Wednesday, what day of the week will it be 100 days from now?",
    "Is the following argument valid? 'If it rains, the street is wet. The street is wet. Therefore it rained.' Explain.",
    "Three boxes are labeled 'apples', 'oranges' and 'mixed', and every label is wrong. You may take one fruit from one box. How do you relabel them correctly?",
    "A lily pad patch doubles in size every day and covers the lake on day 48. On which day did it cover half the lake?",
    "Should a small bakery open on Sundays if Sunday sales are half of weekday sales but staff cost double? List the factors to consider.",
    "Two trains 300 km apart travel toward each other at 70 km/h and 80 km/h. When do they meet?",
    "Why might correlation between ice cream sales and drowning not mean that one causes the other?",
    "If you flip a fair coin three times, what is the probability of getting at least one head?",
)

SUMMARISING = (
    "Summarise in one sentence: The city council voted on Tuesday to convert two car lanes on Main Street into protected bike lanes. Supporters said the change would make cycling safer and reduce traffic noise, while some shop owners worried that fewer parking spaces would hurt business. Construction is planned for next spring.",
    "Summarise the main idea: Sleep plays a key role in memory. During deep sleep the brain replays the day's experiences and strengthens the connections that store them. People who sleep less than six hours a night often perform worse on memory tests, even when they feel rested.",
    "Give a two-sentence summary: Honeybees communicate the location of flowers with a 'waggle dance'. The angle of the dance relative to gravity shows the direction of the food compared with the sun, and the length of the waggle shows the distance. Other bees watch the dance and fly straight to the flowers.",
    "Summarise for a child: Volcanoes form where molten rock, called magma, rises from deep inside the Earth. When pressure builds up, the magma bursts through the surface as lava, ash and gas. Some volcanoes erupt often, while others stay quiet for thousands of years.",
    "Summarise the key points as a bullet list: The new office policy allows employees to work from home up to three days a week. Teams must agree on at least one shared office day. Equipment for home offices can be requested through the IT portal, and travel costs for office days are no longer reimbursed.",
    "Summarise in one sentence: Researchers found that planting trees along busy roads reduced the amount of fine dust reaching nearby homes by up to a quarter. The effect was strongest with dense, evergreen hedges, and weakest with tall trees that had open crowns.",
    "What is the main point of this passage? Many people believe that goldfish have a memory of only three seconds. In fact, experiments show that goldfish can remember feeding routines and simple tasks for months, and can even be trained to respond to sounds.",
    "Summarise this customer review in a few words: I ordered the blue backpack for my trip. The fabric is strong and the zips feel solid, but the shoulder straps are thin and started to hurt after an hour of walking. Delivery was fast. I would buy it again only for short trips.",
    "Summarise in two sentences: The Industrial Revolution began in Britain in the late 18th century. New machines powered by water and steam changed how goods were made, moving work from homes to factories. Cities grew quickly, and while production and wealth increased, many workers faced long hours and poor conditions.",
    "Write a one-line headline for this news: A local high school team has won the national robotics championship with a robot that sorts recycling. The students built it over eight months, using parts from old printers and a budget of only $400.",
    "Summarise the argument: Public libraries are more than places to borrow books. They offer free internet access, classes, a quiet place to study and a warm space in winter. Cutting their budgets saves little money but removes a service that the poorest residents rely on most.",
    "Summarise these meeting notes: The team reviewed the launch plan. Marketing needs final screenshots by Friday. The payment bug is fixed but needs one more test. The launch date stays on the 14th unless testing finds new problems. Next meeting is Monday.",
    "Summarise the instructions in three steps: To repot a plant, first water it a day before so the roots hold together. Choose a pot a few centimetres wider than the old one with a drainage hole. Gently loosen the plant, place it on fresh soil at the same depth as before, fill in around it and water well.",
    "Summarise in one sentence: Octopuses have three hearts and blue blood. Two hearts pump blood through the gills, and the third pumps it through the rest of the body. Their blood uses a copper-based molecule to carry oxygen, which works better in cold water with little oxygen.",
    "Give a short summary: The museum will close its east wing for six months for renovation. The dinosaur exhibition will move temporarily to the main hall, and the cafe will stay open. Tickets bought for dates during the closure can be refunded online.",
    "Summarise the story: A young fisherman found a bottle with a map inside. He followed it to a small island, where instead of gold he found an old woman's garden full of rare plants. He visited her every week after that, and the garden became his treasure.",
    "Summarise the pros and cons described: Electric cars are cheap to run and quiet, and produce no exhaust in cities. However, they cost more to buy, charging takes longer than filling a tank, and in some regions charging stations are still rare.",
)

CATEGORIES = {"arithmetic": ARITHMETIC, "code": CODE, "writing": WRITING, "factual": FACTUAL,
              "reasoning": REASONING, "summarising": SUMMARISING}


def _interleave(groups) -> tuple[str, ...]:
    """One prompt of each kind in turn, so any prefix of the set is varied."""
    out, longest = [], max(len(g) for g in groups)
    for i in range(longest):
        out.extend(g[i] for g in groups if i < len(g))
    return tuple(out)


PROMPTS: tuple[str, ...] = _interleave(tuple(CATEGORIES.values()))
