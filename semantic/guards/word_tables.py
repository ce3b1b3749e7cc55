"""Word tables for the near-duplicate path: abbreviations and their expansions, and words that mean the same.

General English, written for kvgate (never taken from a pairs file). Knows words only: how they are compared
lives in `semantic/guards/near_duplicate.py`.

Expansions are written with spaces where the usual spelling has a hyphen: the near-duplicate path reads a
hyphen between two words as a space ("multi-factor" / "multi factor").
"""

from __future__ import annotations

# The first table. `training/minimal_pairs.py` draws the verifier's abbreviation training pairs from this one
# alone, so that `training/train_verifier.py` still reproduces the shipped weights; add new entries below.
ABBREVIATIONS = {
    "ai": "artificial intelligence", "ml": "machine learning", "hr": "human resources",
    "ein": "employer identification number", "llc": "limited liability company", "ssn": "social security number",
    "ira": "individual retirement account", "apr": "annual percentage rate", "roi": "return on investment",
    "ceo": "chief executive officer", "cfo": "chief financial officer", "cto": "chief technology officer",
    "faq": "frequently asked questions", "diy": "do it yourself", "eta": "estimated time of arrival",
    "asap": "as soon as possible", "fyi": "for your information", "pto": "paid time off",
    "vpn": "virtual private network", "dns": "domain name system",
    "url": "uniform resource locator", "html": "hypertext markup language", "css": "cascading style sheets",
    "api": "application programming interface", "sql": "structured query language", "os": "operating system",
    "cpu": "central processing unit", "gpu": "graphics processing unit", "ram": "random access memory",
    "ssd": "solid state drive", "hdd": "hard disk drive", "usb": "universal serial bus",
    "lan": "local area network", "wan": "wide area network", "ssh": "secure shell", "ftp": "file transfer protocol",
    "pdf": "portable document format", "gps": "global positioning system", "tv": "television",
    "pc": "personal computer", "ui": "user interface", "ux": "user experience", "ide": "integrated development environment",
    "json": "javascript object notation", "xml": "extensible markup language", "2fa": "two factor authentication",
    "mfa": "multi factor authentication", "sso": "single sign on", "crm": "customer relationship management",
    "erp": "enterprise resource planning", "kpi": "key performance indicator", "okr": "objectives and key results",
    "b2b": "business to business", "seo": "search engine optimization", "hoa": "homeowners association",
    "hvac": "heating ventilation and air conditioning", "rpm": "revolutions per minute", "mpg": "miles per gallon",
    "atm": "automated teller machine", "dob": "date of birth",
    "id": "identification", "dmv": "department of motor vehicles", "irs": "internal revenue service",
    "gdp": "gross domestic product", "bmi": "body mass index", "adhd": "attention deficit hyperactivity disorder",
    "ocd": "obsessive compulsive disorder", "ptsd": "post traumatic stress disorder", "cpr": "cardiopulmonary resuscitation",
    "icu": "intensive care unit", "otc": "over the counter", "uti": "urinary tract infection",
    "ibs": "irritable bowel syndrome", "std": "sexually transmitted disease", "dna": "deoxyribonucleic acid",
    "nasa": "national aeronautics and space administration", "eu": "european union",
    "uk": "united kingdom", "usa": "united states of america", "nyc": "new york city",
    "wfh": "work from home", "ooo": "out of office", "eod": "end of day",
    "ev": "electric vehicle", "wifi": "wi fi", "4wd": "four wheel drive",
    "awd": "all wheel drive", "tbd": "to be determined",
    "aka": "also known as", "vs": "versus", "approx": "approximately", "govt": "government",
}  # fmt: skip
# More abbreviations common in chatbot questions (work, IT, money, health, home, hobbies); only those that
# stand for one thing in everyday questions ("IP", "PR", "AC", "ER", "MVP" and "PIP" mean two or more, so
# they are not here).
MORE_ABBREVIATIONS = {
    "cli": "command line interface", "gui": "graphical user interface", "waf": "web application firewall",
    "cdn": "content delivery network", "cors": "cross origin resource sharing",
    "csrf": "cross site request forgery", "xss": "cross site scripting", "jwt": "json web token",
    "sdk": "software development kit", "saas": "software as a service", "vm": "virtual machine",
    "vps": "virtual private server", "nas": "network attached storage", "isp": "internet service provider",
    "dhcp": "dynamic host configuration protocol", "ssl": "secure sockets layer", "tls": "transport layer security",
    "bios": "basic input output system", "psu": "power supply unit", "lcd": "liquid crystal display",
    "hdmi": "high definition multimedia interface", "nfc": "near field communication", "iot": "internet of things",
    "ocr": "optical character recognition", "nlp": "natural language processing", "llm": "large language model",
    "orm": "object relational mapping", "oop": "object oriented programming", "regex": "regular expression",
    "cte": "common table expression", "dbms": "database management system", "etl": "extract transform load",
    "sla": "service level agreement", "nda": "non disclosure agreement", "seo": "search engine optimization",
    "serp": "search engine results page", "ctr": "click through rate", "ppc": "pay per click",
    "cta": "call to action", "b2c": "business to consumer", "cpa": "certified public accountant",
    "hsa": "health savings account", "fsa": "flexible spending account", "espp": "employee stock purchase plan",
    "rsu": "restricted stock unit", "etf": "exchange traded fund", "reit": "real estate investment trust",
    "apy": "annual percentage yield", "heloc": "home equity line of credit", "pmi": "private mortgage insurance",
    "cpi": "consumer price index", "ipo": "initial public offering", "vat": "value added tax",
    "gst": "goods and services tax", "cob": "close of business", "fte": "full time equivalent",
    "cv": "curriculum vitae", "coo": "chief operating officer", "cmo": "chief marketing officer",
    "vp": "vice president", "mba": "master of business administration", "gpa": "grade point average",
    "rsv": "respiratory syncytial virus", "gp": "general practitioner", "copd": "chronic obstructive pulmonary disease",
    "gerd": "gastroesophageal reflux disease", "mri": "magnetic resonance imaging", "ecg": "electrocardiogram",
    "ekg": "electrocardiogram", "sids": "sudden infant death syndrome", "uv": "ultraviolet",
    "spf": "sun protection factor", "ivf": "in vitro fertilization", "pms": "premenstrual syndrome",
    "hiit": "high intensity interval training", "gfci": "ground fault circuit interrupter",
    "suv": "sport utility vehicle", "rv": "recreational vehicle", "dui": "driving under the influence",
    "vin": "vehicle identification number", "esl": "english as a second language", "rpg": "role playing game",
    "npc": "non player character", "dlc": "downloadable content", "dslr": "digital single lens reflex",
    "ent": "ear nose and throat", "ooo": "out of office",
}  # fmt: skip
ALL_ABBREVIATIONS = ABBREVIATIONS | MORE_ABBREVIATIONS

# Words and phrases that ask the same thing wherever they stand in a question; each group is read as its
# first member. Only swaps that keep the answer in everyday questions: "stop" / "remove", "best" / "top",
# "little" / "small" and "explain" / "describe" change it often enough to be the verifier's call.
SYNONYMS: tuple[tuple[str, ...], ...] = (
    ("allowed", "permitted"), ("allow", "permit"), ("okay", "ok", "acceptable", "alright", "all right"),
    ("beginner", "novice", "newbie"), ("beginners", "novices", "newbies"),
    ("remove", "get rid of", "eliminate"), ("vomiting", "throwing up"), ("vomit", "throw up"),
    ("symptoms", "signs"), ("fix", "repair"), ("buy", "purchase"), ("bought", "purchased"),
    ("start", "begin"), ("big", "large"), ("fast", "quick"), ("fastest", "quickest"),
    ("slow", "sluggish"), ("car", "automobile"), ("kids", "children"), ("kid", "child"),
    ("choose", "pick", "select"), ("use", "utilize", "utilise"), ("cheap", "inexpensive"),
    ("get", "obtain"), ("happen", "occur"), ("need", "require"), ("enough", "sufficient"),
    ("maybe", "perhaps"), ("wrong", "incorrect"), ("phone", "cellphone", "cell phone", "mobile phone"),
    ("photo", "picture", "photograph"), ("photos", "pictures", "photographs"), ("movie", "film"),
    ("movies", "films"), ("doctor", "physician"), ("lawyer", "attorney"), ("hard", "difficult"),
    ("easiest", "simplest"), ("vacation", "holiday"), ("trash", "garbage", "rubbish"), ("mom", "mum"),
    ("turn off", "switch off", "shut off", "power off"), ("turn on", "switch on", "power on"),
    ("log in", "sign in", "login"), ("email", "e mail"), ("stomach ache", "stomachache", "tummy ache"),
)  # fmt: skip
